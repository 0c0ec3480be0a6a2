"""Serializers for memories, their change log and memory search. Input is
validated here (the 400s); memories.services does the writing."""
from django.conf import settings
from rest_framework import serializers

from kinsite.api.representation import datetime_value
from memories.models import Memory, MemoryChange

# A memory is one statement, not a document; this bounds a row and a prompt section.
MEMORY_CONTENT_MAX_CHARS = 10_000
REASON_MAX_CHARS = 1_000

LIST_STATUS_ALL = "all"
LIST_SCOPES = ["all", "kin", "shared"]


class RejectUnknownFieldsMixin:
    """A write naming a field this endpoint does not take (a typo, or `status`,
    `kin`, `source`) is refused rather than silently ignored."""

    def validate(self, attrs):
        if isinstance(self.initial_data, dict):
            unknown = sorted(set(self.initial_data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["This field cannot be set here."] for name in unknown})
        return super().validate(attrs)


class MemorySerializer(serializers.ModelSerializer):
    shared = serializers.SerializerMethodField()

    class Meta:
        model = Memory
        fields = [
            "id",
            "kin",
            "shared",
            "category",
            "content",
            "subject",
            "importance",
            "status",
            "source",
            "source_ref",
            "superseded_by",
            "retrieval_count",
            "last_retrieved_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_shared(self, memory) -> bool:
        return memory.kin_id is None


class MemoryAddResponseSerializer(MemorySerializer):
    """POST's answer: the memory, and whether it is new (201) or an existing
    active memory that said the same thing and was updated instead (200)."""

    created = serializers.BooleanField()

    class Meta(MemorySerializer.Meta):
        fields = MemorySerializer.Meta.fields + ["created"]
        read_only_fields = fields


def _content_field(**kwargs):
    return serializers.CharField(max_length=MEMORY_CONTENT_MAX_CHARS, allow_blank=False, **kwargs)


class MemoryCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    content = _content_field()
    category = serializers.ChoiceField(choices=Memory.Category.choices)
    subject = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    importance = serializers.IntegerField(min_value=1, max_value=10, required=False, default=5)
    shared = serializers.BooleanField(
        required=False, default=False, help_text="True: the memory belongs to the whole team, not only this kin."
    )
    reason = serializers.CharField(max_length=REASON_MAX_CHARS, required=False, allow_blank=True, default="")


class MemoryUpdateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    content = _content_field(required=False)
    category = serializers.ChoiceField(choices=Memory.Category.choices, required=False)
    subject = serializers.CharField(max_length=200, required=False, allow_blank=True)
    importance = serializers.IntegerField(min_value=1, max_value=10, required=False)
    reason = serializers.CharField(max_length=REASON_MAX_CHARS, required=False, allow_blank=True, default="")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if not set(attrs) - {"reason"}:
            raise serializers.ValidationError("Give at least one of content, category, subject, importance.")
        return attrs


class MemoryListQuerySerializer(serializers.Serializer):
    category = serializers.ChoiceField(choices=Memory.Category.choices, required=False)
    status = serializers.ChoiceField(
        choices=[*Memory.Status.values, LIST_STATUS_ALL], required=False, default=Memory.Status.ACTIVE
    )
    subject = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    scope = serializers.ChoiceField(choices=LIST_SCOPES, required=False, default="all")


class MemoryChangeSerializer(serializers.ModelSerializer):
    class Meta:
        model = MemoryChange
        fields = ["id", "action", "before", "after", "actor", "reason", "created_at"]
        read_only_fields = fields


class MemorySearchQuerySerializer(serializers.Serializer):
    q = serializers.CharField(max_length=settings.SEARCH_MAX_QUERY_CHARS, allow_blank=True, trim_whitespace=True)
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=settings.SEARCH_MAX_LIMIT, default=settings.MEMORY_TOP_K
    )


class MemoryHitSerializer(serializers.Serializer):
    """One search result: the memory's fields, its final score and the parts the score was made of."""

    memory = MemorySerializer()
    score = serializers.FloatField()
    components = serializers.SerializerMethodField()

    def get_components(self, hit) -> dict[str, float]:
        return dict(hit.components)

    def to_representation(self, hit):
        # The memory's fields, then the score's: written out (kinsite/api/representation.py says why).
        return {**memory_body(hit.memory), "score": float(hit.score), "components": self.get_components(hit)}


def memory_body(memory: Memory) -> dict:
    """MemorySerializer's body, written out for the search results (kinsite/api/representation.py
    says why; tests/memories/test_api_serializers.py holds it equal to MemorySerializer's)."""
    return {
        "id": memory.pk,
        "kin": memory.kin_id,
        "shared": memory.kin_id is None,
        "category": str(memory.category),
        "content": str(memory.content),
        "subject": str(memory.subject),
        "importance": int(memory.importance),
        "status": str(memory.status),
        "source": str(memory.source),
        "source_ref": str(memory.source_ref),
        "superseded_by": memory.superseded_by_id,
        "retrieval_count": int(memory.retrieval_count),
        "last_retrieved_at": datetime_value(memory.last_retrieved_at),
        "created_at": datetime_value(memory.created_at),
        "updated_at": datetime_value(memory.updated_at),
    }
