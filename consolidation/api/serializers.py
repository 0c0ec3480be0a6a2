"""Serializers for the fact ledger, consolidation runs and the experience document.
Input is validated here (the 400s); consolidation.services does the work."""
from rest_framework import serializers

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from consolidation.services import STATEMENT_MAX_CHARS
from kinsite.prompt_templates import template_validate
from memories.api.serializers import RejectUnknownFieldsMixin

MAX_WORDS_MIN = 100
MAX_WORDS_MAX = 10_000
# A template is a prompt, not a corpus: generous, but bounded.
TEMPLATE_MAX_CHARS = 50_000


class FactSerializer(serializers.ModelSerializer):
    # Plain strings in the schema: as enums, "status"/"source" would collide with other enums.
    status = serializers.CharField(read_only=True, help_text="active or superseded.")
    source = serializers.CharField(read_only=True, help_text="introspection, tool, api, dashboard, admin or mcp.")
    pending = serializers.SerializerMethodField(help_text="Active and not consolidated yet.")

    class Meta:
        model = Fact
        fields = [
            "id",
            "kin",
            "statement",
            "category",
            "source",
            "source_ref",
            "memory",
            "status",
            "is_consolidated",
            "pending",
            "consolidated_by_run",
            "superseded_by_run",
            "created_at",
        ]
        read_only_fields = fields

    def get_pending(self, fact) -> bool:
        return fact.status == Fact.Status.ACTIVE and not fact.is_consolidated


class FactCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    statement = serializers.CharField(max_length=STATEMENT_MAX_CHARS, allow_blank=False)
    category = serializers.ChoiceField(choices=Fact.Category.choices, required=False, default=Fact.Category.FACT)


class FactListQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Fact.Status.choices, required=False)
    pending = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="true: only pending facts; false: only the others."
    )


class ConsolidateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    template = serializers.CharField(
        required=False,
        allow_blank=True,  # so an empty body gets the template's own "is empty" message
        trim_whitespace=False,
        max_length=TEMPLATE_MAX_CHARS,
        help_text="An explicit consolidation template body for this run (instead of the kin's, team's or default).",
    )
    max_words = serializers.IntegerField(
        required=False, min_value=MAX_WORDS_MIN, max_value=MAX_WORDS_MAX, help_text="Word limit of the document."
    )
    prepare = serializers.BooleanField(
        required=False, default=False, help_text="true: render the prompt only; no model call, nothing changes."
    )

    def validate_template(self, value):
        errors = template_validate("consolidation", value)
        if errors:
            raise serializers.ValidationError(errors)
        return value


class ConsolidationRunSerializer(serializers.ModelSerializer):
    """A run without its bulky fields (the rendered prompt and the raw model answers)."""

    status = serializers.CharField(
        read_only=True, help_text="pending, running, prepared, applied, rejected, failed or skipped."
    )
    trigger = serializers.CharField(read_only=True, help_text="nightly, api, dashboard, admin or command.")
    template_source = serializers.CharField(read_only=True, help_text="explicit, kin, team or default.")
    experience_version = serializers.SerializerMethodField(help_text="The version this run wrote, if it applied.")
    processed_fact_ids = serializers.JSONField(read_only=True)
    superseded_fact_ids = serializers.JSONField(read_only=True)
    validation_errors = serializers.JSONField(read_only=True, help_text="Why each answer was refused, in order.")

    class Meta:
        model = ConsolidationRun
        fields = [
            "id",
            "kin",
            "trigger",
            "status",
            "night",
            "template_source",
            "template",
            "max_words",
            "summary_of_changes",
            "processed_fact_ids",
            "superseded_fact_ids",
            "validation_errors",
            "word_count",
            "experience_version",
            "tokens_in",
            "tokens_out",
            "duration_ms",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_experience_version(self, run) -> int | None:
        return run.experience_version.version if run.experience_version_id else None


class ConsolidationRunDetailSerializer(ConsolidationRunSerializer):
    raw_answers = serializers.JSONField(read_only=True, help_text="Every model answer, in order.")

    class Meta(ConsolidationRunSerializer.Meta):
        fields = ConsolidationRunSerializer.Meta.fields + ["rendered_prompt", "raw_answers"]
        read_only_fields = fields


class ConsolidationListQuerySerializer(serializers.Serializer):
    full = serializers.BooleanField(
        required=False, default=False, help_text="true: include each run's rendered_prompt and raw_answers."
    )


class ExperienceQuerySerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, min_value=1, help_text="Default: the current version.")
    section = serializers.CharField(
        required=False,
        max_length=200,
        help_text="A section number (\"2\") or heading text (\"Defensive Safeguards\"); default: the whole document.",
    )


class ExperienceSerializer(serializers.ModelSerializer):
    run = serializers.PrimaryKeyRelatedField(read_only=True, help_text="The consolidation run that wrote it.")

    class Meta:
        model = ExperienceVersion
        fields = ["version", "markdown", "word_count", "run", "created_at"]
        read_only_fields = fields
