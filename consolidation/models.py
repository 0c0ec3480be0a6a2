"""The fact ledger, consolidation runs (the audit trail) and the versioned experience document."""
from django.db import models
from django.db.models import Q

from kinsite.models import Job, job_status_field, job_sweep_indexes


class Fact(models.Model):
    """One learning, append-only: its statement never changes. Consolidation marks
    it consolidated, or superseded by a newer fact. Pending = active and not consolidated."""

    class Category(models.TextChoices):
        FACT = "fact"
        PREFERENCE = "preference"
        DECISION = "decision"
        KNOWLEDGE = "knowledge"

    class Source(models.TextChoices):
        INTROSPECTION = "introspection"
        TOOL = "tool"
        API = "api", "API"
        DASHBOARD = "dashboard"
        ADMIN = "admin"
        MCP = "mcp", "MCP"  # an agent's client through the MCP server (agent_mcp)

    class Status(models.TextChoices):
        ACTIVE = "active"
        SUPERSEDED = "superseded"

    kin = models.ForeignKey("kinsite.Kin", on_delete=models.CASCADE, related_name="facts")
    statement = models.TextField()
    category = models.CharField(max_length=12, choices=Category.choices, default=Category.FACT)
    source = models.CharField(max_length=16, choices=Source.choices)
    # Which writer: "introspection_run:12", "event:345", "token:ks_ab12cd", "user:maria".
    source_ref = models.CharField("source reference", max_length=200, blank=True)
    # The memory this fact records (introspection and tool facts), so supersession reaches it.
    memory = models.ForeignKey(
        "memories.Memory", null=True, blank=True, on_delete=models.SET_NULL, related_name="facts"
    )
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    is_consolidated = models.BooleanField("consolidated", default=False)
    consolidated_by_run = models.ForeignKey(
        "ConsolidationRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="processed_facts"
    )
    superseded_by_run = models.ForeignKey(
        "ConsolidationRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="superseded_facts"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["kin", "created_at"],
                condition=Q(status="active", is_consolidated=False),
                name="fact_pending",
            )
        ]

    def __str__(self):
        return self.statement[:80]


class ConsolidationRun(Job):
    """One consolidation of a kin: the audit row, written whatever the outcome."""

    class Trigger(models.TextChoices):
        NIGHTLY = "nightly"
        API = "api", "API"
        DASHBOARD = "dashboard"
        ADMIN = "admin"
        COMMAND = "command"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        APPLIED = "applied"
        REJECTED = "rejected"  # the answer failed validation twice: nothing changed
        FAILED = "failed"  # the model or the apply step failed: nothing changed
        PREPARED = "prepared"  # prompt rendered only, no model called
        SKIPPED = "skipped"  # a requested run closed without a model call (error says why): nothing changed

    kin = models.ForeignKey("kinsite.Kin", on_delete=models.CASCADE, related_name="consolidation_runs")
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    status = job_status_field(Status)
    # The local date (team time zone) a nightly run is for; one nightly run per kin and night.
    night = models.DateField(null=True, blank=True)
    template_source = models.CharField(max_length=10, blank=True)  # explicit | kin | team | default
    template = models.ForeignKey(
        "kinsite.PromptTemplate", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_words = models.PositiveIntegerField(default=1200)
    rendered_prompt = models.TextField(blank=True)
    # Every model answer, in order (the first, then the corrective retry's).
    raw_answers = models.JSONField(default=list, blank=True)
    validation_errors = models.JSONField(default=list, blank=True)
    processed_fact_ids = models.JSONField("processed fact IDs", default=list, blank=True)
    superseded_fact_ids = models.JSONField("superseded fact IDs", default=list, blank=True)
    summary_of_changes = models.TextField(blank=True)
    word_count = models.PositiveIntegerField(default=0)
    experience_version = models.ForeignKey(
        "ExperienceVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    duration_ms = models.PositiveIntegerField("duration (ms)", default=0)
    # started_at: when it was claimed (a requested run) or began (a run made at once).

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            *job_sweep_indexes("consolidation_run"),
            # A kin's runs newest first: the experience page and the activity pages.
            models.Index(fields=["kin", "created_at", "id"], name="consolidation_run_kin_newest"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["kin", "night"], condition=Q(trigger="nightly"), name="consolidation_one_nightly_per_kin"
            )
        ]

    def __str__(self):
        return f"Consolidation {self.pk} of kin {self.kin_id} ({self.status})"


class ExperienceVersion(models.Model):
    """One version of a kin's experience document; the highest version is current."""

    kin = models.ForeignKey("kinsite.Kin", on_delete=models.CASCADE, related_name="experience_versions")
    version = models.PositiveIntegerField()
    markdown = models.TextField()
    word_count = models.PositiveIntegerField(default=0)
    run = models.ForeignKey(ConsolidationRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kin", "-version"]
        constraints = [models.UniqueConstraint(fields=["kin", "version"], name="experience_unique_version")]

    def __str__(self):
        return f"Experience v{self.version} of kin {self.kin_id}"
