"""Groups are permission sets of the whole installation: staff who are not superusers neither
see nor change them in the admin, and the user form offers them no groups, permissions or
superuser status (a team admin cannot grant what reaches past their teams). Found in the code
for issue 27: Django's Group admin was open to any staff user with the auth permissions."""
import pytest
from django.contrib.auth.models import Group, Permission
from django.urls import reverse

from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

# staff (of `team`, every model permission, not a superuser) is in tests/kinsite/conftest.py.


@pytest.fixture
def installation_group():
    group = Group.objects.create(name="Installation editors")
    group.permissions.set(Permission.objects.filter(codename="change_kin"))
    return group


def test_staff_do_not_see_the_groups(client, staff, installation_group):
    client.force_login(staff)
    index = client.get(reverse("admin:index"))
    assert reverse("admin:auth_group_changelist") not in index.content.decode()
    assert client.get(reverse("admin:auth_group_changelist")).status_code in (403, 404)
    assert client.get(reverse("admin:auth_group_change", args=[installation_group.pk])).status_code in (403, 404)


def test_staff_cannot_create_or_change_a_group(client, staff, installation_group):
    every = [str(pk) for pk in Permission.objects.values_list("pk", flat=True)]
    client.force_login(staff)
    client.post(reverse("admin:auth_group_add"), {"name": "Everything", "permissions": every})
    client.post(reverse("admin:auth_group_change", args=[installation_group.pk]),
                {"name": "Installation editors", "permissions": every})
    client.post(reverse("admin:auth_group_delete", args=[installation_group.pk]), {"post": "yes"})
    assert not Group.objects.filter(name="Everything").exists()
    assert list(installation_group.permissions.values_list("codename", flat=True)) == ["change_kin"]


def test_staff_user_form_offers_no_installation_wide_fields(client, staff, team):
    colleague = UserFactory()
    MembershipFactory(team=team, user=colleague)
    client.force_login(staff)
    for url in (reverse("admin:auth_user_change", args=[colleague.pk]), reverse("admin:auth_user_add")):
        form = client.get(url).context["adminform"].form
        assert not {"is_superuser", "groups", "user_permissions"} & set(form.fields)


def test_superusers_manage_groups(client, installation_group):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    assert client.get(reverse("admin:auth_group_changelist")).status_code == 200
    response = client.post(reverse("admin:auth_group_change", args=[installation_group.pk]),
                           {"name": "Renamed", "permissions": []})
    assert response.status_code == 302
    installation_group.refresh_from_db()
    assert installation_group.name == "Renamed"
