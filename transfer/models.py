"""The record of kin imports: which document (by digest) made which kin in a team, so
importing the same document again answers the kin it made instead of a second copy."""
from django.db import models


class KinImport(models.Model):
    team = models.ForeignKey("kinsite.Team", on_delete=models.CASCADE, related_name="kin_imports")
    # Deleting the imported kin deletes this record too, so the document can be imported again.
    # kin.imports tells an imported kin from others of the same name (the dashboard's lists).
    kin = models.ForeignKey("kinsite.Kin", on_delete=models.CASCADE, related_name="imports")
    # SHA-256 of the document's canonical JSON (sorted keys, no spaces): the same document
    # sent pretty-printed or compact is the same import.
    digest = models.CharField(max_length=64)
    format_version = models.PositiveSmallIntegerField()
    # The kin's id in the installation it was exported from (informational).
    source_kin_id = models.BigIntegerField("source kin ID", null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["team", "digest"], name="kinimport_unique_team_digest")]

    def __str__(self):
        return f"Import of kin {self.kin_id} ({self.digest[:12]}…)"
