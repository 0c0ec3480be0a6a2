"""Teams, memberships, API tokens, kins, the LLM call log and prompt templates; Job, the
abstract model of every background run (kinsite.jobmodels)."""
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from kinsite.jobmodels import Job, job_status_field, job_sweep_indexes  # noqa: F401 - every app's run models build on them


def validate_timezone(value: str) -> None:
    if value not in zoneinfo.available_timezones():
        raise ValidationError(f"{value!r} is not an IANA time zone name (e.g. Europe/Berlin).")


class Team(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    # IANA name; nightly jobs and the prompt's context block use it.
    timezone = models.CharField("time zone", max_length=64, default="UTC", validators=[validate_timezone])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def zone(self, default: str = "UTC") -> zoneinfo.ZoneInfo:
        """The team's time zone; `default` when the name is unknown (it is validated on save,
        but a hand-edited row must not fail every prompt or nightly scan)."""
        try:
            return zoneinfo.ZoneInfo(self.timezone or default)
        except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
            return zoneinfo.ZoneInfo(default)


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"

        @property
        def rank(self) -> int:
            """Owner above admin above member: nobody manages an account, or grants a role,
            above their own (kinsite/admin_mixins.py)."""
            return {"member": 0, "admin": 1, "owner": 2}[self.value]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]

    def __str__(self):
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 digest is stored; the raw token is shown once."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    # The first characters of the raw token, to tell tokens apart in lists.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Kin(models.Model):
    """An AI agent of a team. Here, beside Team, so every app may depend on it."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="kins")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=200, blank=True)
    character = models.TextField(blank=True)
    expertise = models.TextField(blank=True)
    # Empty: the gateway's default model (LLM_MODEL).
    model = models.CharField(max_length=200, blank=True)
    # Empty: HISTORY_TOKEN_BUDGET.
    history_token_budget = models.PositiveIntegerField(null=True, blank=True)
    # A sub-kin names the kin that spawned it and why.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    spawn_reason = models.TextField(blank=True)
    # Per-kin overrides of settings such as INTROSPECTION; the sections, their bounds and the
    # size cap are sessions_app.overrides' (checked where a kin is saved).
    overrides = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # The table kept its name when the model moved here from sessions_app .
        db_table = "sessions_app_kin"
        ordering = ["id"]

    def __str__(self):
        return self.name

    @property
    def effective_history_budget(self) -> int:
        return self.history_token_budget or settings.HISTORY_TOKEN_BUDGET


class LLMCall(models.Model):
    """One call to a model endpoint: an append-only audit row."""

    class Status(models.TextChoices):
        OK = "ok", "OK"
        ERROR = "error"

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kin = models.ForeignKey(Kin, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    purpose = models.CharField(max_length=50)
    provider = models.CharField(max_length=30)
    model = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, default="chat")  # chat | embedding
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField("latency (ms)", default=0)
    attempts = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(max_length=10, choices=Status.choices)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "LLM call"
        indexes = [
            # A kin's and a team's calls newest first: the activity pages (sessions_app.activity).
            models.Index(fields=["kin", "created_at", "id"], name="llmcall_kin_newest"),
            models.Index(fields=["team", "created_at", "id"], name="llmcall_team_newest"),
        ]

    def __str__(self):
        return f"{self.purpose} {self.model} {self.status}"


class PromptTemplate(models.Model):
    """An admin-editable prompt for a background job, resolved explicit → kin's → team's →
    built-in default (kinsite.prompt_templates)."""

    class Kind(models.TextChoices):
        INTROSPECTION = "introspection"
        CONSOLIDATION = "consolidation"
        COMPACTION = "compaction"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="prompt_templates")
    # Empty: the team's template for every kin without its own.
    kin = models.ForeignKey(
        Kin, null=True, blank=True, on_delete=models.CASCADE, related_name="prompt_templates"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=100)
    body = models.TextField()
    is_active = models.BooleanField("active", default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team", "kind", "kin", "-updated_at"]
        constraints = [
            # At most one active template per (team, kin, kind); kin NULL is the team's own.
            models.UniqueConstraint(
                fields=["team", "kin", "kind"],
                condition=models.Q(is_active=True, kin__isnull=False),
                name="prompttemplate_one_active_per_kin",
            ),
            models.UniqueConstraint(
                fields=["team", "kind"],
                condition=models.Q(is_active=True, kin__isnull=True),
                name="prompttemplate_one_active_per_team",
            ),
        ]

    def __str__(self):
        return f"{self.kind}: {self.name}"
