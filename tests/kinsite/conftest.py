"""The LLM gateway tests use fake_llm and fake_llm_provider from tests/conftest.py. The
admin tests (test_admin_scoping, test_admin_privilege_escalation) share `staff`."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from tests.factories import MembershipFactory, UserFactory


@pytest.fixture
def staff(team):
    """Staff of `team` with every model permission, not a superuser."""
    user = UserFactory(is_staff=True)
    user.user_permissions.set(Permission.objects.all())
    MembershipFactory(team=team, user=user, role="admin")
    return get_user_model().objects.get(pk=user.pk)  # fresh: no cached permissions
