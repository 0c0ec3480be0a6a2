"""Django admin and tenancy (SPEC §3): a staff user who is not a superuser lists, opens and
chooses only rows of their own teams, in every admin (read from admin.site._registry, so a
new admin is covered without editing this file); a superuser sees every team's rows."""
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.forms import ModelChoiceField
from django.urls import reverse
from django.utils import timezone

from erasure.models import Erasure
from kinsite.admin_mixins import team_path
from kinsite.models import PromptTemplate
from memories.models import EmbeddingRun, MemoryTermCount, MemoryVector, MemoryVectorScope
from sessions_app.models import CompactionRun, IntrospectionRun
from tests.abuse.support import seed_team
from tests.factories import (
    IntrospectionRunFactory,
    LLMCallFactory,
    MembershipFactory,
    MessageFactory,
    NodeResultFactory,
    NodeRunFactory,
    PromptTemplateFactory,
    SummaryFactory,
    UserFactory,
)
from transfer.models import KinImport

pytestmark = pytest.mark.django_db

User = get_user_model()
# Groups are permission sets of the whole installation, and re-embedding runs span every
# team's memories, and vector scopes and full-text counters are trigger-kept bookkeeping with
# plain ids: owned by no team, shown to superusers only, out of scope here.
NOT_TEAM_OWNED = {Group, EmbeddingRun, MemoryVectorScope, MemoryTermCount}
ADMIN_MODELS = [model for model in admin.site._registry if model not in NOT_TEAM_OWNED]


def seed_everything(team, *, secret, user):
    """One row of every admin's model for `team` (beyond seed_team's)."""
    seeded = seed_team(team, secret=secret, user=user)
    first = MessageFactory(session=seeded.session, content=f"first {secret}")
    last = MessageFactory(session=seeded.session, content=f"last {secret}")
    now = timezone.now()
    SummaryFactory(session=seeded.session, content=f"Summary {secret}", first_event=first, last_event=last,
                   first_at=now - timedelta(minutes=1), last_at=now, message_count=2)
    IntrospectionRunFactory(session=seeded.session, trigger=IntrospectionRun.Trigger.MANUAL)
    CompactionRun.objects.create(session=seeded.session)
    LLMCallFactory(team=team, kin=seeded.kin, purpose="kin_turn", provider="scripted", model=secret, status="ok")
    PromptTemplateFactory(team=team, kin=seeded.kin, kind="consolidation", name=f"Template {secret}",
                          body="{kin_name}", is_active=False)
    NodeResultFactory(node=seeded.node, version=1, records=[], config_fingerprint=secret)
    NodeRunFactory(run__workflow=seeded.workflow, node=seeded.node)
    MemoryVector.objects.create(memory=seeded.memory, vector=b"\x00\x00\x80\x3f" * 4)
    KinImport.objects.create(team=team, kin=seeded.kin, digest=secret.ljust(64, "0"), format_version=1)
    Erasure.objects.create(team=team, kin=seeded.kin, sender=f"Person {secret}", actor=f"user:{user.username}",
                           actor_user=user)
    return seeded


# staff (of `team`, every model permission, not a superuser) is in tests/kinsite/conftest.py.


@pytest.fixture
def rows(team, other_team, user, staff):
    other_team.name = "Borealis"
    other_team.save()
    outsider = UserFactory(username="borealis-member")
    MembershipFactory(team=other_team, user=outsider)
    seed_everything(team, secret="zanzibar", user=user)
    seed_everything(other_team, secret="xylophone", user=outsider)
    return {"own": team, "other": other_team}


def rows_of(model, team):
    if model is User:
        return model.objects.filter(memberships__team=team)
    return model.objects.filter(**{team_path(model): team.pk})


def admin_url(model, view, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_every_admin_model_is_team_owned_and_seeded(rows):
    for model in ADMIN_MODELS:
        assert model is User or team_path(model), f"{model.__name__}: no foreign-key path to a team"
        assert rows_of(model, rows["other"]).exists(), f"seed_everything makes no {model.__name__} row"
        assert rows_of(model, rows["own"]).exists(), f"seed_everything makes no {model.__name__} row"


@pytest.mark.parametrize("model", ADMIN_MODELS, ids=lambda m: m._meta.label)
def test_staff_lists_and_opens_only_their_teams_rows(model, client, staff, rows):
    client.force_login(staff)
    changelist = client.get(admin_url(model, "changelist"))
    assert changelist.status_code == 200
    listed = {obj.pk for obj in changelist.context["cl"].queryset}
    assert set(rows_of(model, rows["own"]).values_list("pk", flat=True)) <= listed
    assert not listed & set(rows_of(model, rows["other"]).values_list("pk", flat=True))
    page = changelist.content.decode()
    assert "xylophone" not in page and "Borealis" not in page  # nor in list filters

    for other in rows_of(model, rows["other"]):
        response = client.get(admin_url(model, "change", other.pk))
        # The admin answers a missing object with a redirect to its index.
        assert response.status_code in (302, 404), (model.__name__, response.status_code)
        assert "xylophone" not in response.content.decode()
        assert client.get(admin_url(model, "history", other.pk)).status_code in (302, 404)
        delete = client.post(admin_url(model, "delete", other.pk), {"post": "yes"})
        assert delete.status_code in (302, 403, 404)
        assert model.objects.filter(pk=other.pk).exists()


@pytest.mark.parametrize("model", ADMIN_MODELS, ids=lambda m: m._meta.label)
def test_staff_choose_only_their_teams_rows_in_forms(model, client, staff, rows):
    client.force_login(staff)
    pages = [admin_url(model, "change", rows_of(model, rows["own"]).first().pk), admin_url(model, "add")]
    for url in pages:
        response = client.get(url)
        if response.status_code == 403:  # no add form (audit tables)
            continue
        assert response.status_code == 200, (url, response.status_code)
        forms = [response.context["adminform"].form]
        forms += [form for formset in response.context["inline_admin_formsets"] for form in formset.formset.forms]
        for form in forms:
            for name, field in form.fields.items():
                # An inline row's own id: Django validates it against the rows of the parent.
                if isinstance(field, ModelChoiceField) and name != form._meta.model._meta.pk.name:
                    if field.queryset.model is not User and not team_path(field.queryset.model):
                        continue  # permissions and groups: the installation's, no team's
                    foreign = rows_of(field.queryset.model, rows["other"])
                    assert not field.queryset.filter(pk__in=foreign.values("pk")).exists(), (url, name)
        assert "xylophone" not in response.content.decode() and "Borealis" not in response.content.decode()


RAW_ID_CASES = [(model, name) for model, model_admin in admin.site._registry.items()
                for name in model_admin.raw_id_fields]


@pytest.mark.parametrize(("model", "field_name"), RAW_ID_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_a_raw_id_of_another_team_shows_nothing_of_it(model, field_name, client, staff, rows):
    """A raw-id box labels the id it holds with the object's name: posted back with another
    team's id, the form says the choice is invalid and names nothing."""
    client.force_login(staff)
    related = model._meta.get_field(field_name).related_model
    foreign = rows_of(related, rows["other"]).first()
    for url in (admin_url(model, "change", rows_of(model, rows["own"]).first().pk), admin_url(model, "add")):
        response = client.post(url, {field_name: foreign.pk})
        if response.status_code == 403:  # read-only: no form
            continue
        assert response.status_code == 200, (url, response.status_code)
        assert field_name in response.context["adminform"].form.errors
        assert "xylophone" not in response.content.decode()
    own = rows_of(model, rows["own"]).first()
    if getattr(own, field_name) is not None:  # the team's own object is still labelled
        page = client.get(admin_url(model, "change", own.pk)).content.decode()
        assert f">{getattr(own, field_name)}</a>" in page


@pytest.mark.parametrize(("model_name", "field_name"), [("membership", "team"), ("membership", "user")])
def test_autocompletes_offer_only_the_staff_users_teams(model_name, field_name, client, staff, rows):
    client.force_login(staff)
    response = client.get(reverse("admin:autocomplete"),
                          {"app_label": "kinsite", "model_name": model_name, "field_name": field_name, "term": ""})
    assert response.status_code == 200
    assert response.json()["results"]
    assert "Borealis" not in response.content.decode() and "borealis" not in response.content.decode()


def test_staff_cannot_add_a_template_to_another_team(client, staff, rows):
    client.force_login(staff)
    response = client.post(admin_url(PromptTemplate, "add"), {
        "team": rows["other"].pk, "kind": "consolidation", "name": "Planted", "body": "{kin_name}",
    })
    assert response.status_code == 200
    assert "team" in response.context["adminform"].form.errors
    assert not PromptTemplate.objects.filter(name="Planted").exists()


def test_staff_of_several_teams_see_each_of_them(client, staff, rows):
    MembershipFactory(team=rows["other"], user=staff)
    client.force_login(staff)
    listed = {obj.pk for obj in client.get(admin_url(PromptTemplate, "changelist")).context["cl"].queryset}
    assert listed == set(PromptTemplate.objects.values_list("pk", flat=True))


@pytest.mark.parametrize("model", ADMIN_MODELS, ids=lambda m: m._meta.label)
def test_superusers_see_every_teams_rows(model, client, rows):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    changelist = client.get(admin_url(model, "changelist"))
    listed = {obj.pk for obj in changelist.context["cl"].queryset}
    assert set(rows_of(model, rows["other"]).values_list("pk", flat=True)) <= listed
    other = rows_of(model, rows["other"]).first()
    assert client.get(admin_url(model, "change", other.pk)).status_code == 200
