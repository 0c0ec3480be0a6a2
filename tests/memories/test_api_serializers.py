"""The search results' hand-written bodies (memory_body, MemoryHitSerializer.to_representation)
are what DRF's generic serializers made of the same objects: same keys, same order, same values."""
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from memories.api.serializers import MemoryHitSerializer, MemorySerializer, memory_body
from memories.models import Memory
from memories.search.selectors import MemoryHit, memory_search
from tests.factories import MemoryFactory

pytestmark = pytest.mark.usefixtures("private_cache")


def generic_hit(hit: MemoryHit) -> dict:
    """What MemoryHitSerializer answered before its to_representation was written out."""
    data = dict(serializers.Serializer.to_representation(MemoryHitSerializer(), hit))
    return {**data.pop("memory"), **data}


def rendered(data) -> bytes:
    return JSONRenderer().render(data)


def varied_memories(kin):
    newer = MemoryFactory(team=kin.team, kin=kin, content="The launch is on Friday.", subject="launch")
    return [
        newer,
        MemoryFactory(team=kin.team, kin=None, content="The team's launch checklist has nine items.",
                      category=Memory.Category.PREFERENCE, importance=9),
        MemoryFactory(team=kin.team, kin=kin, content="The launch was on Thursday.", status=Memory.Status.SUPERSEDED,
                      superseded_by=newer, source=Memory.Source.TURN, source_ref="event:12",
                      retrieval_count=3, last_retrieved_at=timezone.now() - timedelta(days=2)),
    ]


def test_memory_body_is_the_memory_serializers_body(kin):
    for memory in varied_memories(kin):
        for fresh in (memory, Memory.objects.get(pk=memory.pk)):  # as written, and as read back
            body = memory_body(fresh)
            assert body == MemorySerializer(fresh).data
            assert rendered(body) == rendered(MemorySerializer(fresh).data)


@pytest.mark.parametrize("zone", ["UTC", "Pacific/Auckland"])
def test_search_hits_are_serialized_as_drf_serialized_them(kin, zone):
    varied_memories(kin)
    with timezone.override(zone):
        hits = memory_search(team=kin.team, kin=kin, query="launch", limit=10)
        assert len(hits) == 2  # active ones only: the kin's and the shared one
        hits.append(MemoryHit(memory=Memory.objects.get(status=Memory.Status.SUPERSEDED), score=0.25,
                              components={"text": 0.5, "importance": 0.1}))
        for hit in hits:
            assert MemoryHitSerializer(hit).data == generic_hit(hit)
        body = MemoryHitSerializer(hits, many=True).data
        assert rendered(body) == rendered([generic_hit(hit) for hit in hits])
    assert list(json.loads(rendered(body))[0]) == [*MemorySerializer.Meta.fields, "score", "components"]
