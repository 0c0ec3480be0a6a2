"""The dashboard's Export button (a download of the kin document) and the kins page's import
form: roles, team scoping, refused files shown with their problems and nothing stored."""
import json
import uuid

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from kinsite.models import Kin
from tests.factories import KinFactory, MembershipFactory, UserFactory
from tests.transfer.conftest import table_counts
from transfer.selectors import kin_export_document

XSS = '<script>alert("x")</script>'


@pytest.fixture(autouse=True)
def private_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"transfer-dashboard-{uuid.uuid4()}"}}


@pytest.fixture
def owner(client, user, team):
    client.force_login(user)  # `user` owns `team` (tests/conftest.py)
    return client


def upload(content: str | bytes, name="kin.json"):
    data = content.encode("utf-8") if isinstance(content, str) else content
    return SimpleUploadedFile(name, data, content_type="application/json")


def test_the_kin_page_offers_the_export_and_it_downloads_the_document(owner, full_kin):
    page = owner.get(reverse("dashboard:kin_detail", args=[full_kin.pk]))
    assert reverse("dashboard:kin_export", args=[full_kin.pk]) in page.content.decode()

    response = owner.get(reverse("dashboard:kin_export", args=[full_kin.pk]), {"sessions": "1"})
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith(f'attachment; filename="kin-{full_kin.pk}-')
    document = json.loads(response.content)
    assert document["includes_sessions"] is True and document["kin"]["name"] == full_kin.name
    without = json.loads(owner.get(reverse("dashboard:kin_export", args=[full_kin.pk])).content)
    assert without["includes_sessions"] is False


def test_another_teams_kin_does_not_export(owner, other_team):
    stranger = KinFactory(team=other_team)
    assert owner.get(reverse("dashboard:kin_export", args=[stranger.pk])).status_code == 404


def test_an_owner_imports_a_file_and_the_same_file_again(owner, full_kin, team):
    text = json.dumps(kin_export_document(kin=full_kin, include_sessions=True))
    assert 'action="/kins/import/"' in owner.get(reverse("dashboard:kins")).content.decode()

    response = owner.post(reverse("dashboard:kin_import"), {"document": upload(text)})
    kin = Kin.objects.filter(team=team).exclude(pk=full_kin.pk).get()
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('dashboard:kin_detail', args=[kin.pk])}?imported=new"
    assert "Kin imported." in owner.get(response["Location"]).content.decode()

    counts = table_counts()
    again = owner.post(reverse("dashboard:kin_import"), {"document": upload(text)})
    assert again["Location"] == f"{reverse('dashboard:kin_detail', args=[kin.pk])}?imported=again"
    assert table_counts() == counts


def test_a_refused_file_shows_its_problems_escaped_and_stores_nothing(owner, full_kin):
    document = json.loads(json.dumps(kin_export_document(kin=full_kin)))
    document["memories"][0]["category"] = XSS
    counts = table_counts()
    response = owner.post(reverse("dashboard:kin_import"), {"document": upload(json.dumps(document))})
    body = response.content.decode()
    assert response.status_code == 400
    assert "memories[0].category" in body and "Nothing was imported" in body
    assert XSS not in body and "&lt;script&gt;" in body
    assert table_counts() == counts


def test_a_truncated_or_oversized_file_is_refused(owner, full_kin, settings):
    text = json.dumps(kin_export_document(kin=full_kin))
    counts = table_counts()
    cut = owner.post(reverse("dashboard:kin_import"), {"document": upload(text[: len(text) // 2])})
    assert cut.status_code == 400 and "not a readable kin document" in cut.content.decode()
    settings.TRANSFER_MAX_DOCUMENT_BYTES = 100
    large = owner.post(reverse("dashboard:kin_import"), {"document": upload(text)})
    assert large.status_code == 413 and "TRANSFER_MAX_DOCUMENT_BYTES" in large.content.decode()
    missing = owner.post(reverse("dashboard:kin_import"), {})
    assert missing.status_code == 400
    assert table_counts() == counts


def test_members_may_export_but_not_import(client, team, full_kin):
    member = UserFactory()
    MembershipFactory(team=team, user=member, role="member")
    client.force_login(member)
    assert client.get(reverse("dashboard:kin_export", args=[full_kin.pk])).status_code == 200
    assert 'action="/kins/import/"' not in client.get(reverse("dashboard:kins")).content.decode()
    text = json.dumps(kin_export_document(kin=full_kin))
    assert client.post(reverse("dashboard:kin_import"), {"document": upload(text)}).status_code == 403
    assert Kin.objects.filter(team=team).count() == 1
