"""The hand-written bodies of messages, history hits and turns (MessageSerializer,
HistoryHitSerializer and TurnSerializer's to_representation) are what DRF's generic
serializers made of the same objects: same keys, same order, same values."""
import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from sessions_app.api.serializers import HistoryHitSerializer, MessageSerializer, TurnSerializer, turn_posted_body
from sessions_app.models import Event, Turn
from sessions_app.selectors import history_search
from sessions_app.turns.services import TurnFailed, turn_post
from tests.factories import MessageFactory, TurnFactory

pytestmark = pytest.mark.usefixtures("fake_llm_gateway", "empty_cache")

ZONES = ["UTC", "Pacific/Auckland"]


def generic(serializer_class, instance) -> dict:
    """What the serializer answered before its to_representation was written out: DRF's
    generic one over the declared fields (a turn's nested messages are MessageSerializer's,
    held to the generic one by the first test)."""
    return dict(serializers.Serializer.to_representation(serializer_class(), instance))


def rendered(data) -> bytes:
    return JSONRenderer().render(data)


def assert_same(serializer_class, instance):
    body = serializer_class(instance).data
    reference = generic(serializer_class, instance)
    assert body == reference
    assert rendered(body) == rendered(reference)  # the same keys in the same order, the same JSON
    return body


@pytest.mark.parametrize("zone", ZONES)
def test_message_body_is_the_generic_one(chat_session, zone):
    messages = [
        MessageFactory(session=chat_session),
        MessageFactory(session=chat_session, role=Event.Role.ASSISTANT, sender="", external_id="wa-17",
                       platform=Event.Platform.WHATSAPP),
    ]
    with timezone.override(zone):
        for message in messages:
            for fresh in (message, Event.objects.get(pk=message.pk)):
                assert list(assert_same(MessageSerializer, fresh)) == MessageSerializer.Meta.fields


@pytest.mark.parametrize("zone", ZONES)
def test_history_hits_are_serialized_as_before(chat_session, zone):
    MessageFactory(session=chat_session, content="the launch plan has two steps", external_id="a")
    MessageFactory(session=chat_session, content="we talked about the launch", sender="", external_id=None)
    MessageFactory(session=chat_session, content="nothing to see here")
    hits = history_search(session=chat_session, query="launch", limit=10)
    assert len(hits) == 2
    with timezone.override(zone):
        for hit in hits:
            assert list(assert_same(HistoryHitSerializer, hit)) == HistoryHitSerializer.Meta.fields
        assert rendered(HistoryHitSerializer(hits, many=True).data) == rendered(
            [generic(HistoryHitSerializer, hit) for hit in hits])


def turns_of_every_kind(session, fake_llm) -> list[Turn]:
    fake_llm.reply("Step one, then step two.")
    done = turn_post(session=session, content="What is the launch plan?", sender="Maria")
    checkpoint = turn_post(session=session, content="/checkpoint before the launch")
    new = turn_post(session=session, content="/new Launch week")
    fake_llm.error(400, "model 'nope' does not exist")
    with pytest.raises(TurnFailed):
        turn_post(session=session, content="And then?")
    pending = TurnFactory(session=session)  # queued: not started, no reply
    return [done, checkpoint, new, Turn.objects.get(status=Turn.Status.FAILED), pending]


@pytest.mark.parametrize("zone", ZONES)
def test_turns_are_serialized_as_before(chat_session, fake_llm, zone):
    turns = turns_of_every_kind(chat_session, fake_llm)
    with timezone.override(zone):
        for turn in turns:
            read_back = Turn.objects.select_related("user_message", "reply").get(pk=turn.pk)
            for instance in (turn, read_back):
                assert list(assert_same(TurnSerializer, instance)) == TurnSerializer.Meta.fields
    new = Turn.objects.get(pk=turns[2].pk)
    body = turn_posted_body(new)
    assert body["new_session_id"] == body["turn"]["new_session_id"] and body["turn"]["command"] == "new"
    assert body["turn"]["reply"]["id"] == new.reply_id
