from rest_framework import serializers

from erasure.models import Erasure
from erasure.services import STORES
from kinsite.selectors import MAX_ROW_ID

NAME_MIN_CHARS = 2


class ErasureRequestSerializer(serializers.Serializer):
    sender = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                   help_text="The sender name the person's messages carry.")
    subject = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                    help_text="The name the person's text is found by (whole words, any case).")
    kin_id = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1, max_value=MAX_ROW_ID,
                                      help_text="Only this kin; empty: every kin of the team and its shared memories.")
    dry_run = serializers.BooleanField(required=False, default=False,
                                       help_text="List what would go, erase nothing, keep no receipt.")

    def validate(self, attrs):
        names = {key: attrs[key].strip() for key in ("sender", "subject")}
        if not any(names.values()):
            raise serializers.ValidationError("Give the person's sender name, a subject, or both.")
        for key, name in names.items():
            if name and len(name) < NAME_MIN_CHARS:
                raise serializers.ValidationError({key: f"At least {NAME_MIN_CHARS} characters."})
        return {**attrs, **names}


def _store_counts():
    return serializers.DictField(child=serializers.IntegerField(),
                                 help_text=f"Rows erased or redacted per store: {', '.join(STORES)}.")


class ErasureSerializer(serializers.ModelSerializer):
    """A receipt: what went, counts and row ids per store, never the erased text."""

    dry_run = serializers.SerializerMethodField()
    kin_id = serializers.IntegerField(read_only=True, allow_null=True)
    counts = _store_counts()
    items = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()),
                                  help_text="The ids of the rows erased or redacted, per store, and the "
                                            "experience versions written without the lines.")
    total = serializers.IntegerField(read_only=True)

    class Meta:
        model = Erasure
        fields = ["id", "dry_run", "sender", "subject", "kin_id", "kin_label", "counts", "total", "items",
                  "actor", "created_at"]
        read_only_fields = fields

    def get_dry_run(self, obj) -> bool:
        return False


class FindingSerializer(serializers.Serializer):
    store = serializers.CharField()
    id = serializers.IntegerField()
    action = serializers.CharField(help_text="delete, redact, new version (experience) or fail (a pending turn).")
    excerpt = serializers.CharField()


class ErasureDryRunSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    sender = serializers.CharField()
    subject = serializers.CharField()
    kin_id = serializers.IntegerField(allow_null=True)
    counts = _store_counts()
    total = serializers.IntegerField()
    items = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()))
    found = FindingSerializer(many=True, help_text="The first 500 findings, with excerpts.")
    found_truncated = serializers.BooleanField(help_text="Whether there were more than `found` lists.")
    running = serializers.ListField(child=serializers.CharField(),
                                    help_text="Jobs that would make the erasure wait (409) if it ran now.")
