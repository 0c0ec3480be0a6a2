"""Workflows: DAGs of nodes and edges, their runs, and the results each node produced."""
from django.db import models
from django.db.models import Q

from kinsite.models import Job, job_sweep_indexes


class Workflow(models.Model):
    team = models.ForeignKey("kinsite.Team", on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Archived: left out of the lists unless asked for; kept whole, and it still runs.
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return self.name


class Node(models.Model):
    class Status(models.TextChoices):
        IDLE = "idle"  # never ran
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"  # an upstream node failed

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="nodes")
    # The client's id for the node, unique within the workflow (what edges and exports use).
    client_id = models.CharField("client ID", max_length=100)
    type = models.CharField(max_length=50)
    label = models.CharField(max_length=200, blank=True)
    config = models.JSONField(default=dict, blank=True)
    # Where the editor drew it: {"x": .., "y": ..}; optional.
    position = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.IDLE)
    records_in = models.PositiveIntegerField(null=True, blank=True)
    records_out = models.PositiveIntegerField(null=True, blank=True)
    # Bumped each time the node stores new results; 0 = no results yet.
    results_version = models.PositiveIntegerField(default=0)
    # Fingerprint of `config` when the current results were produced ("" = never ran).
    config_fingerprint = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["workflow", "id"]
        constraints = [models.UniqueConstraint(fields=["workflow", "client_id"], name="node_unique_client_id")]

    def __str__(self):
        return self.label or self.client_id


class Edge(models.Model):
    class Kind(models.TextChoices):
        DATA = "data"  # records flow along it; lineage walks these
        CONTROL = "control"  # ordering only

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="edges")
    source = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="out_edges")
    target = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="in_edges")
    source_handle = models.CharField(max_length=50, blank=True)
    target_handle = models.CharField(max_length=50, blank=True)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.DATA)

    class Meta:
        ordering = ["workflow", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "target", "source_handle", "target_handle"], name="edge_unique_connection"
            ),
            models.CheckConstraint(condition=~Q(source=models.F("target")), name="edge_no_self_loop"),
        ]

    def __str__(self):
        return f"{self.source_id} → {self.target_id}"


class NodeResult(models.Model):
    """The records a node produced in one run (one row per results version)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="results")
    version = models.PositiveIntegerField()
    records = models.JSONField(default=list)
    config_fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node", "-version"]
        constraints = [models.UniqueConstraint(fields=["node", "version"], name="noderesult_unique_version")]

    def __str__(self):
        return f"Results v{self.version} of node {self.node_id}"


class WorkflowRun(Job):
    """One run of a workflow, a job of kinsite.jobs (workflows.jobs). Failed: at least one
    node failed (its downstream nodes were skipped), or its worker stopped in a node."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="runs")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            *job_sweep_indexes("workflow_run"),
            # A workflow's runs newest first: its last run, and the team's activity page.
            models.Index(fields=["workflow", "created_at", "id"], name="workflow_run_newest"),
        ]

    def __str__(self):
        return f"Run {self.pk} of workflow {self.workflow_id} ({self.status})"


class NodeRun(models.Model):
    """One node's part of a workflow run: counts, fingerprint, the lineage narrative
    computed once for it ({{_lineage}}), outcome."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="node_runs")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="runs")
    wave = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    records_in = models.PositiveIntegerField(null=True, blank=True)
    records_out = models.PositiveIntegerField(null=True, blank=True)
    config_fingerprint = models.CharField(max_length=64, blank=True)
    lineage_narrative = models.TextField(blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "wave", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "node"], name="noderun_unique_node")]

    def __str__(self):
        return f"Node {self.node_id} in run {self.run_id} ({self.status})"
