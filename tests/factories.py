"""factory-boy factories for the rows tests need."""
import factory
from django.contrib.auth import get_user_model

from kinsite.models import Kin, Membership, Team
from kinsite.tokencount import count_tokens
from memories.models import Memory
from sessions_app.models import Event, Session


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "pass-word-123")

    @factory.post_generation
    def saved(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class KinFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Kin

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"Kin {n}")
    role = "Assistant"


class SessionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Session

    kin = factory.SubFactory(KinFactory)
    title = factory.Sequence(lambda n: f"Session {n}")


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    session = factory.SubFactory(SessionFactory)
    kind = Event.Kind.MESSAGE
    role = Event.Role.USER
    sender = "Maria"
    platform = Event.Platform.API
    content = factory.Sequence(lambda n: f"message number {n}")
    token_count = factory.LazyAttribute(lambda o: count_tokens(o.content))


class MemoryFactory(factory.django.DjangoModelFactory):
    """A memory row written directly (no change row, no duplicate check): use
    memories.services when the test is about writes."""

    class Meta:
        model = Memory

    kin = factory.SubFactory(KinFactory)
    team = factory.LazyAttribute(lambda o: o.kin.team if o.kin is not None else TeamFactory())
    category = Memory.Category.FACT
    content = factory.Sequence(lambda n: f"memory number {n}")
    importance = 5
