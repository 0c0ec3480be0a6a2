"""Django admin and tenancy (SPEC §3, docs/dashboard.md "Admin"): staff who are not
superusers see only their teams' rows. The user admin must not let such staff step out of
that scope by making themselves (or anyone they can edit) a superuser: a superuser sees and
changes every team's kins, sessions, memories and tokens.

Found by verification of issue 14 from outside: `staffa` (staff of team A, every model
permission, not a superuser) opened /admin/auth/user/<own id>/change/, ticked "Superuser
status" and saved (302); /admin/sessions_app/kin/ then listed team B's kin. The same staff
user also set a new password for the demo superuser (a member of team A) at
/admin/auth/user/1/password/ (302) and logged in as that superuser with it."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from kinsite.models import Kin
from tests.factories import KinFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

User = get_user_model()


# staff (of `team`, every model permission, not a superuser) is in tests/kinsite/conftest.py.


def change_form_data(client, user, **changes):
    """The user change form's current values as POST data, with `changes` applied."""
    response = client.get(reverse("admin:auth_user_change", args=[user.pk]))
    assert response.status_code == 200
    form = response.context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        if field.disabled:
            continue
        value = form[name].value()
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        elif isinstance(value, list | tuple):
            data[name] = [str(v) for v in value if v is not None]
        elif value is None:
            data[name] = ""
        else:
            data[name] = value
    # Split date/time widgets post as name_0 / name_1.
    for name in ("last_login", "date_joined"):
        if name in data:
            raw = form[name].value()
            data.pop(name)
            data[f"{name}_0"] = raw.strftime("%Y-%m-%d") if raw else ""
            data[f"{name}_1"] = raw.strftime("%H:%M:%S") if raw else ""
    for name, value in changes.items():
        if value is True:
            data[name] = "on"
        elif value is False:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def test_the_user_change_form_saves_for_staff(client, staff):
    # The helper builds a valid form: a harmless edit goes through.
    client.force_login(staff)
    response = client.post(reverse("admin:auth_user_change", args=[staff.pk]),
                           change_form_data(client, staff, first_name="Renamed"))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else None
    staff.refresh_from_db()
    assert staff.first_name == "Renamed"


def test_staff_cannot_make_themselves_superuser(client, staff, other_team):
    secret = KinFactory(team=other_team, name="Borealis kin")
    client.force_login(staff)
    client.post(reverse("admin:auth_user_change", args=[staff.pk]),
                change_form_data(client, staff, is_superuser=True))
    staff.refresh_from_db()
    assert not staff.is_superuser, "a staff user who is not a superuser made themselves a superuser"
    listed = {kin.pk for kin in client.get(reverse("admin:kinsite_kin_changelist")).context["cl"].queryset}
    assert secret.pk not in listed
    assert Kin.objects.filter(pk=secret.pk).exists()


@pytest.mark.parametrize("in_team", [True, False], ids=["colleague", "user-in-no-team"])
def test_staff_cannot_make_another_user_superuser(client, staff, team, in_team):
    other = UserFactory(is_staff=True)
    if in_team:
        MembershipFactory(team=team, user=other)
    client.force_login(staff)
    client.post(reverse("admin:auth_user_change", args=[other.pk]),
                change_form_data(client, other, is_superuser=True))
    other.refresh_from_db()
    assert not other.is_superuser


def test_staff_cannot_set_the_password_of_a_superuser_in_their_team(client, staff, team):
    # Verification: staffa posted /admin/auth/user/1/password/ (the demo superuser, a member
    # of staffa's team) → 302, then logged in as the superuser with the new password.
    boss = UserFactory(is_staff=True, is_superuser=True)
    boss.set_password("the-old-password-1")
    boss.save()
    MembershipFactory(team=team, user=boss, role="owner")
    client.force_login(staff)
    client.post(reverse("admin:auth_user_password_change", args=[boss.pk]), {
        "password1": "Takeover-pass-987", "password2": "Takeover-pass-987", "usable_password": "true",
    })
    boss.refresh_from_db()
    assert boss.check_password("the-old-password-1"), "a staff user who is not a superuser reset a superuser's password"


def test_staff_cannot_edit_a_superuser_in_their_team(client, staff, team):
    boss = UserFactory(is_staff=True, is_superuser=True, email="boss@example.com")
    MembershipFactory(team=team, user=boss, role="owner")
    client.force_login(staff)
    response = client.get(reverse("admin:auth_user_change", args=[boss.pk]))
    if response.status_code == 200:
        client.post(reverse("admin:auth_user_change", args=[boss.pk]),
                    change_form_data(client, boss, email="attacker@example.com", is_staff=False))
    boss.refresh_from_db()
    assert boss.email == "boss@example.com" and boss.is_staff


def test_staff_see_no_installation_wide_fields_and_cannot_change_staff_status(client, staff, team):
    colleague = UserFactory(is_staff=False)
    MembershipFactory(team=team, user=colleague)
    client.force_login(staff)
    form = client.get(reverse("admin:auth_user_change", args=[colleague.pk])).context["adminform"].form
    assert not {"is_superuser", "groups", "user_permissions", "is_staff"} & set(form.fields)
    client.post(reverse("admin:auth_user_change", args=[colleague.pk]),
                change_form_data(client, colleague, is_staff=True,
                                 user_permissions=[str(pk) for pk in Permission.objects.values_list("pk", flat=True)]))
    colleague.refresh_from_db()
    assert not colleague.is_staff and not colleague.user_permissions.exists()


def test_superusers_still_see_and_grant_every_field(client, team):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    member = UserFactory()
    form = client.get(reverse("admin:auth_user_change", args=[member.pk])).context["adminform"].form
    assert {"is_superuser", "groups", "user_permissions", "is_staff"} <= set(form.fields)


def test_staff_can_still_set_a_colleagues_password(client, staff, team):
    colleague = UserFactory()
    MembershipFactory(team=team, user=colleague)
    client.force_login(staff)
    response = client.post(reverse("admin:auth_user_password_change", args=[colleague.pk]), {
        "password1": "Fresh-pass-987", "password2": "Fresh-pass-987", "usable_password": "true",
    })
    assert response.status_code == 302
    colleague.refresh_from_db()
    assert colleague.check_password("Fresh-pass-987")


def test_staff_cannot_take_over_someone_who_is_also_in_another_team(client, staff, team, other_team):
    # Their password would open the other team to whoever set it.
    both = UserFactory()
    both.set_password("the-old-password-1")
    both.save()
    MembershipFactory(team=team, user=both)
    MembershipFactory(team=other_team, user=both, role="owner")
    client.force_login(staff)
    response = client.post(reverse("admin:auth_user_password_change", args=[both.pk]), {
        "password1": "Takeover-pass-987", "password2": "Takeover-pass-987", "usable_password": "true",
    })
    assert response.status_code == 403
    both.refresh_from_db()
    assert both.check_password("the-old-password-1")


def test_staff_cannot_take_over_a_colleague_holding_permissions_they_lack(client, team):
    limited = UserFactory(is_staff=True)
    limited.user_permissions.set(Permission.objects.filter(content_type__app_label="auth", codename__endswith="_user"))
    MembershipFactory(team=team, user=limited, role="admin")
    stronger = UserFactory(is_staff=True)
    stronger.user_permissions.set(Permission.objects.all())
    MembershipFactory(team=team, user=stronger, role="admin")
    client.force_login(User.objects.get(pk=limited.pk))
    assert client.get(reverse("admin:auth_user_password_change", args=[stronger.pk])).status_code == 403


def test_staff_cannot_delete_a_superuser_in_their_team(client, staff, team):
    boss = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(team=team, user=boss, role="owner")
    client.force_login(staff)
    client.post(reverse("admin:auth_user_delete", args=[boss.pk]), {"post": "yes"})
    client.post(reverse("admin:auth_user_changelist"),
                {"action": "delete_selected", "_selected_action": [boss.pk], "post": "yes"})
    assert User.objects.filter(pk=boss.pk).exists()
