"""Admin for the consolidation app: facts are added (through fact_record, source
"admin") but never changed or deleted; runs and versions are read-only; the kin
list's "Consolidate now" action runs a consolidation with trigger "admin"."""
import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from consolidation import services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from tests.consolidation.test_api import DOCUMENT, answer
from tests.factories import ConsolidationRunFactory, ExperienceVersionFactory, UserFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(db):
    return UserFactory(is_staff=True, is_superuser=True, username="maria")


@pytest.fixture
def staff_client(client, staff):
    client.force_login(staff)
    return client


def test_staff_add_a_fact_through_the_ledger(staff_client, kin):
    assert staff_client.get(reverse("admin:consolidation_fact_add")).status_code == 200

    response = staff_client.post(
        reverse("admin:consolidation_fact_add"),
        {"kin": kin.pk, "statement": "  Maria wants weekly reports.  ", "category": "preference"},
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    fact = Fact.objects.get()
    assert fact.kin == kin and fact.statement == "Maria wants weekly reports." and fact.category == "preference"
    assert fact.source == Fact.Source.ADMIN and fact.source_ref == "user:maria"
    assert fact.status == Fact.Status.ACTIVE and not fact.is_consolidated
    assert LogEntry.objects.get().object_id == str(fact.pk)


def test_the_add_form_offers_only_kin_statement_and_category(staff_client):
    body = staff_client.get(reverse("admin:consolidation_fact_add")).content.decode()

    assert 'name="statement"' in body and 'name="category"' in body and 'name="kin"' in body
    for field in ("source", "source_ref", "status", "is_consolidated", "superseded_by_run"):
        assert f'name="{field}"' not in body


def test_a_blank_statement_is_refused(staff_client, kin):
    response = staff_client.post(
        reverse("admin:consolidation_fact_add"), {"kin": kin.pk, "statement": "", "category": "fact"}
    )

    assert response.status_code == 200  # the form again, with its error
    assert not Fact.objects.exists()


def test_facts_are_never_changed_or_deleted(staff_client, kin):
    fact = services.fact_record(kin=kin, statement="The warehouse is in Leeds.", source=Fact.Source.API)

    change_page = staff_client.get(reverse("admin:consolidation_fact_change", args=[fact.pk]))
    assert change_page.status_code == 200
    assert 'name="statement"' not in change_page.content.decode()
    staff_client.post(
        reverse("admin:consolidation_fact_change", args=[fact.pk]),
        {"kin": kin.pk, "statement": "The warehouse is in York.", "category": "fact"},
    )
    delete = staff_client.post(reverse("admin:consolidation_fact_delete", args=[fact.pk]), {"post": "yes"})

    assert delete.status_code == 403
    fact.refresh_from_db()
    assert fact.statement == "The warehouse is in Leeds."


def test_runs_and_versions_are_read_only(staff_client, kin):
    run = ConsolidationRunFactory(kin=kin, trigger="api", status="applied")
    version = ExperienceVersionFactory(kin=kin, version=1, markdown=DOCUMENT, run=run)

    for model, obj in (("consolidationrun", run), ("experienceversion", version)):
        assert staff_client.get(reverse(f"admin:consolidation_{model}_add")).status_code == 403
        delete_url = reverse(f"admin:consolidation_{model}_delete", args=[obj.pk])
        assert staff_client.post(delete_url, {"post": "yes"}).status_code == 403
        page = staff_client.get(reverse(f"admin:consolidation_{model}_change", args=[obj.pk]))
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode()


def test_consolidate_now_action_runs_a_consolidation_per_selected_kin(staff_client, kin):
    pending = services.fact_record(kin=kin, statement="Maria wants weekly reports.", source=Fact.Source.API)

    with provider_override(ScriptedProvider([answer(processed=[pending.pk])])):
        response = staff_client.post(
            reverse("admin:kinsite_kin_changelist"),
            {"action": "consolidate_now", "_selected_action": [kin.pk]},
            follow=True,
        )

    run = ConsolidationRun.objects.get(kin=kin)
    assert run.trigger == ConsolidationRun.Trigger.ADMIN and run.status == ConsolidationRun.Status.APPLIED
    assert ExperienceVersion.objects.get(kin=kin).version == 1
    assert f"{kin.name}: run {run.pk} applied, experience version 1." in response.content.decode()


def test_consolidate_now_action_reports_a_failed_run(staff_client, kin):
    services.fact_record(kin=kin, statement="Maria wants weekly reports.", source=Fact.Source.API)

    with provider_override(ScriptedProvider([LLMError("The endpoint is down.")])):
        response = staff_client.post(
            reverse("admin:kinsite_kin_changelist"),
            {"action": "consolidate_now", "_selected_action": [kin.pk]},
            follow=True,
        )

    run = ConsolidationRun.objects.get(kin=kin)
    assert run.status == ConsolidationRun.Status.FAILED
    assert "The endpoint is down." in response.content.decode()
    assert not ExperienceVersion.objects.exists()


def test_consolidate_now_action_without_pending_facts_says_so(staff_client, kin):
    with provider_override(ScriptedProvider([])):  # any model call would fail the test
        response = staff_client.post(
            reverse("admin:kinsite_kin_changelist"),
            {"action": "consolidate_now", "_selected_action": [kin.pk]},
            follow=True,
        )

    assert f"Nothing to consolidate: {kin.name} has no pending facts." in response.content.decode()
    assert not ConsolidationRun.objects.exists() and not ExperienceVersion.objects.exists()
