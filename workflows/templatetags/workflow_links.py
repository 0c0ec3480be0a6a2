"""Links to a node's inspector and lineage downloads that stay safe for node ids stored
before ids were checked (workflows.services.node_id_problem): such a node has no link."""
from django import template
from django.urls import reverse

from workflows.services import node_id_problem

register = template.Library()


@register.simple_tag
def node_url(workflow_id: int, client_id: str, fmt: str = "") -> str:
    """The inspector's address (with fmt, the lineage download's), or "" when the id cannot
    be carried by one (a line break: no route matches it, so reversing would raise)."""
    if node_id_problem(client_id):
        return ""
    if fmt:
        return reverse("dashboard:workflow_node_export", args=[workflow_id, fmt, client_id])
    return reverse("dashboard:workflow_node", args=[workflow_id, client_id])
