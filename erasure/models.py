"""The receipt of an erasure: whom a team asked to erase, what went (counts and row ids per
store, never the text), when and by whom. Kept after the data is gone."""
from django.conf import settings
from django.db import models


class Erasure(models.Model):
    team = models.ForeignKey("kinsite.Team", on_delete=models.CASCADE, related_name="erasures")
    # The kin the erasure was limited to; null: the whole team. kin_label keeps its id and
    # name for the receipt once the kin itself is deleted.
    kin = models.ForeignKey("kinsite.Kin", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kin_label = models.CharField(max_length=200, blank=True)
    # What was asked: the person's sender name and/or the name their text is found by. The
    # receipt keeps them, so that the team can show the request was carried out.
    sender = models.CharField(max_length=200, blank=True)
    subject = models.CharField(max_length=200, blank=True)
    # {"<store>": <rows erased or redacted>} and {"<store>": [row ids]} (erasure.services.STORES).
    counts = models.JSONField(default=dict)
    items = models.JSONField(default=dict)
    # Who asked ("token:ks_ab12cd", "user:maria": kinsite.actors).
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "created_at", "id"], name="erasure_team_newest")]

    def __str__(self):
        return f"Erasure {self.pk} of {self.sender or self.subject}"

    @property
    def total(self) -> int:
        return sum(self.counts.values())
