"""Team roles are ranked in the admin (owner > admin > member): staff who are not superusers
cannot take over, edit or delete an account whose role in a shared team outranks theirs, nor
give anyone (themselves included) a role above their own. Found in the code for issue 27: a
team admin could reset the team owner's password at /admin/auth/user/<id>/password/."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from kinsite.models import Membership
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

User = get_user_model()
NEW_PASSWORD = {"password1": "Takeover-pass-987", "password2": "Takeover-pass-987", "usable_password": "true"}

# staff (of `team`, role admin, every model permission, not a superuser) is in conftest.py;
# `user` is the owner of `team` (tests/conftest.py).


@pytest.fixture
def owner(user):
    user.set_password("the-owners-password-1")
    user.save()
    return user


def test_team_admin_cannot_reset_the_owners_password(client, staff, owner):
    client.force_login(staff)
    assert client.get(reverse("admin:auth_user_password_change", args=[owner.pk])).status_code in (403, 404)
    response = client.post(reverse("admin:auth_user_password_change", args=[owner.pk]), NEW_PASSWORD)
    assert response.status_code in (403, 404)
    owner.refresh_from_db()
    assert owner.check_password("the-owners-password-1")


def test_team_admin_cannot_edit_the_owner(client, staff, owner):
    client.force_login(staff)
    response = client.get(reverse("admin:auth_user_change", args=[owner.pk]))
    if response.status_code == 200:  # shown read-only at most: a post changes nothing
        assert not response.context["has_change_permission"]
    email = owner.email
    client.post(reverse("admin:auth_user_change", args=[owner.pk]),
                {"username": owner.username, "email": "attacker@example.com", "is_active": "on"})
    owner.refresh_from_db()
    assert owner.email == email


def test_team_admin_cannot_delete_the_owner(client, staff, owner):
    client.force_login(staff)
    client.post(reverse("admin:auth_user_delete", args=[owner.pk]), {"post": "yes"})
    client.post(reverse("admin:auth_user_changelist"),
                {"action": "delete_selected", "_selected_action": [owner.pk], "post": "yes"})
    assert User.objects.filter(pk=owner.pk).exists()


def test_owner_outranking_in_one_shared_team_is_enough(client, staff, team):
    # Owner of a second team the admin is only a member of: outranks them there.
    second = TeamFactory()
    MembershipFactory(team=second, user=staff, role="admin")
    target = UserFactory()
    MembershipFactory(team=team, user=target, role="member")
    MembershipFactory(team=second, user=target, role="owner")
    client.force_login(staff)
    assert client.post(reverse("admin:auth_user_password_change", args=[target.pk]),
                       NEW_PASSWORD).status_code in (403, 404)


def test_team_admin_still_manages_members_and_fellow_admins(client, staff, team):
    for role in ("member", "admin"):
        colleague = UserFactory()
        MembershipFactory(team=team, user=colleague, role=role)
        client.force_login(staff)
        response = client.post(reverse("admin:auth_user_password_change", args=[colleague.pk]), NEW_PASSWORD)
        assert response.status_code == 302
        colleague.refresh_from_db()
        assert colleague.check_password(NEW_PASSWORD["password1"])


def test_member_with_staff_rights_cannot_reset_an_admins_password(client, team):
    member = UserFactory(is_staff=True)
    member.user_permissions.set(Permission.objects.all())
    MembershipFactory(team=team, user=member, role="member")
    admin = UserFactory()
    MembershipFactory(team=team, user=admin, role="admin")
    client.force_login(User.objects.get(pk=member.pk))
    assert client.post(reverse("admin:auth_user_password_change", args=[admin.pk]),
                       NEW_PASSWORD).status_code in (403, 404)


def test_owner_may_manage_the_team_admin(client, staff, owner, team):
    # The owner as staff with every permission may re-password their admin.
    owner.is_staff = True
    owner.save()
    owner.user_permissions.set(Permission.objects.all())
    client.force_login(User.objects.get(pk=owner.pk))
    assert client.post(reverse("admin:auth_user_password_change", args=[staff.pk]), NEW_PASSWORD).status_code == 302


# --- memberships: nobody is raised above the editor's own role -----------------------------


def test_team_admin_cannot_make_themselves_owner(client, staff, team):
    membership = Membership.objects.get(team=team, user=staff)
    client.force_login(staff)
    client.post(reverse("admin:kinsite_membership_change", args=[membership.pk]),
                {"user": staff.pk, "team": team.pk, "role": "owner"})
    membership.refresh_from_db()
    assert membership.role == "admin"


def test_team_admin_cannot_add_an_owner(client, staff, team):
    newcomer = UserFactory()
    client.force_login(staff)
    client.post(reverse("admin:kinsite_membership_add"), {"user": newcomer.pk, "team": team.pk, "role": "owner"})
    assert not Membership.objects.filter(user=newcomer, role="owner").exists()


def test_team_admin_cannot_demote_or_remove_the_owner(client, staff, owner, team):
    membership = Membership.objects.get(team=team, user=owner)
    client.force_login(staff)
    client.post(reverse("admin:kinsite_membership_change", args=[membership.pk]),
                {"user": owner.pk, "team": team.pk, "role": "member"})
    client.post(reverse("admin:kinsite_membership_delete", args=[membership.pk]), {"post": "yes"})
    membership.refresh_from_db()
    assert membership.role == "owner"


def team_page_data(team, rows, **changes):
    data = {"name": team.name, "slug": team.slug, "timezone": team.timezone,
            "memberships-TOTAL_FORMS": str(len(rows)), "memberships-INITIAL_FORMS": str(len(rows)),
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    for i, row in enumerate(rows):
        data.update({f"memberships-{i}-id": row.pk, f"memberships-{i}-team": team.pk,
                     f"memberships-{i}-user": row.user_id, f"memberships-{i}-role": row.role})
    return {**data, **changes}


def test_team_admin_saves_the_team_page_with_the_owner_left_alone(client, staff, team):
    rows = list(Membership.objects.filter(team=team).order_by("pk"))
    client.force_login(staff)
    response = client.post(reverse("admin:kinsite_team_change", args=[team.pk]),
                           team_page_data(team, rows, name="Renamed team"))
    assert response.status_code == 302
    team.refresh_from_db()
    assert team.name == "Renamed team"


def test_team_admin_cannot_raise_anyone_to_owner_in_the_team_page(client, staff, team):
    colleague = UserFactory()
    membership = MembershipFactory(team=team, user=colleague, role="member")
    owner_membership = Membership.objects.get(team=team, role="owner")
    staff_membership = Membership.objects.get(team=team, user=staff)
    client.force_login(staff)
    rows = [owner_membership, staff_membership, membership]
    data = team_page_data(team, rows)
    data["memberships-2-role"] = "owner"
    client.post(reverse("admin:kinsite_team_change", args=[team.pk]), data)
    membership.refresh_from_db()
    assert membership.role == "member"


def test_team_admin_cannot_remove_the_owner_in_the_team_page(client, staff, team):
    rows = list(Membership.objects.filter(team=team).order_by("pk"))
    owner_index = next(i for i, row in enumerate(rows) if row.role == "owner")
    client.force_login(staff)
    client.post(reverse("admin:kinsite_team_change", args=[team.pk]),
                team_page_data(team, rows, **{f"memberships-{owner_index}-DELETE": "on"}))
    assert Membership.objects.filter(team=team, role="owner").exists()


def test_team_admin_can_still_add_a_member(client, staff, team):
    newcomer = UserFactory()
    client.force_login(staff)
    response = client.post(reverse("admin:kinsite_membership_add"),
                           {"user": newcomer.pk, "team": team.pk, "role": "admin"})
    assert response.status_code == 302
    assert Membership.objects.filter(user=newcomer, team=team, role="admin").exists()

