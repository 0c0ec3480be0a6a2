"""Lineage exports: the walker's graph (workflows.lineage) as plain JSON, W3C PROV-JSON and
OpenLineage run events."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict
from datetime import UTC, datetime

from workflows.lineage import LineageGraph

PRODUCER = "https://github.com/kinsite/kinsite/tree/main/workflows/lineage.py"
OPENLINEAGE_RUN_EVENT_SCHEMA = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/definitions/RunEvent"
PARENT_RUN_FACET_SCHEMA = "https://openlineage.io/spec/facets/1-0-0/ParentRunFacet.json#/$defs/ParentRunFacet"
OUTPUT_STATISTICS_FACET_SCHEMA = (
    "https://openlineage.io/spec/facets/1-0-0/OutputStatisticsOutputDatasetFacet.json"
    "#/$defs/OutputStatisticsOutputDatasetFacet"
)


def lineage_to_json(graph: LineageGraph) -> dict:
    return {
        "node": graph.node_id,
        "stale": graph.stale,
        "stale_reasons": list(graph.stale_reasons),
        "entries": [asdict(entry) for entry in graph.entries],
        "edges": [{"source": edge.source, "target": edge.target} for edge in graph.edges],
    }


def _local_name(text: str) -> str:
    # PROV qualified names: keep letters, digits and a few safe marks; escape the rest.
    return re.sub(r"[^A-Za-z0-9_.\-]", lambda m: f"_{ord(m.group()):02X}" if ord(m.group()) < 256
                  else f"_u{ord(m.group()):04X}", text)


def _prov_value(value):
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def lineage_to_prov(graph: LineageGraph, *, workflow_name: str, namespace: str) -> dict:
    """W3C PROV-JSON: one entity per node output (its current results), one activity per
    node run, usage, generation and derivation along the data edges, and the workflow as
    the software agent every activity is associated with. `namespace` is the URI behind
    the `kinsite:` prefix; parameters use the `param:` prefix."""
    base = namespace if namespace.endswith(("/", "#")) else namespace + "/"

    def entity_id(node_id: str) -> str:
        return f"kinsite:results.{_local_name(node_id)}"

    def activity_id(node_id: str) -> str:
        return f"kinsite:run.{_local_name(node_id)}"

    agent_id = f"kinsite:workflow.{_local_name(workflow_name)}"
    document: dict = {
        "prefix": {"kinsite": base, "param": base + "param#", "xsd": "http://www.w3.org/2001/XMLSchema#"},
        "entity": {},
        "activity": {},
        "agent": {agent_id: {"prov:type": {"$": "prov:SoftwareAgent", "type": "xsd:QName"},
                             "prov:label": workflow_name}},
        "wasGeneratedBy": {},
        "used": {},
        "wasDerivedFrom": {},
        "wasAssociatedWith": {},
    }
    for entry in graph.entries:
        entity = {"prov:label": f"Records of {entry.name}", "kinsite:nodeId": entry.id,
                  "kinsite:resultsVersion": entry.results_version}
        if entry.records_out is not None:
            entity["kinsite:recordCount"] = entry.records_out
        if entry.stale_cause:
            entity["kinsite:staleCause"] = entry.stale_cause
        document["entity"][entity_id(entry.id)] = entity
        activity = {"prov:type": {"$": f"kinsite:{_local_name(entry.type)}", "type": "xsd:QName"},
                    "prov:label": entry.label or entry.id, "kinsite:nodeId": entry.id,
                    "kinsite:summary": entry.summary, "kinsite:status": entry.status}
        if entry.records_in is not None:
            activity["kinsite:recordsIn"] = entry.records_in
        for key, value in entry.params.items():
            activity[f"param:{_local_name(str(key))}"] = _prov_value(value)
        document["activity"][activity_id(entry.id)] = activity
        document["wasGeneratedBy"][f"_:gen.{_local_name(entry.id)}"] = {
            "prov:entity": entity_id(entry.id), "prov:activity": activity_id(entry.id)}
        document["wasAssociatedWith"][f"_:assoc.{_local_name(entry.id)}"] = {
            "prov:activity": activity_id(entry.id), "prov:agent": agent_id}
    for n, edge in enumerate(graph.edges, start=1):
        document["used"][f"_:use{n}"] = {"prov:activity": activity_id(edge.target),
                                          "prov:entity": entity_id(edge.source)}
        document["wasDerivedFrom"][f"_:der{n}"] = {
            "prov:generatedEntity": entity_id(edge.target), "prov:usedEntity": entity_id(edge.source),
            "prov:activity": activity_id(edge.target)}
    return {key: value for key, value in document.items() if value}


_EVENT_TYPES = {"done": "COMPLETE", "failed": "FAIL", "running": "START", "skipped": "ABORT"}


def lineage_to_openlineage(
    graph: LineageGraph, *, workflow_name: str, namespace: str, run_id: str | uuid.UUID,
    event_time: datetime | str,
) -> list[dict]:
    """OpenLineage run events, one per node in topological order. Each node is a job
    `<workflow>.<node id>`, run as a child of the workflow run `run_id` (parent facet) with
    its own run id derived from it; its output dataset `<workflow>.<node id>` is an input
    of its downstream nodes. Status → eventType: done COMPLETE, failed FAIL, running START,
    skipped (an upstream node failed) ABORT, idle and pending OTHER."""
    if isinstance(event_time, datetime):
        event_time = (event_time if event_time.tzinfo else event_time.replace(tzinfo=UTC)).isoformat()
    parent_run = uuid.UUID(str(run_id))
    parents: dict[str, list[str]] = {}
    for edge in graph.edges:
        parents.setdefault(edge.target, []).append(edge.source)

    def dataset(node_id: str) -> dict:
        return {"namespace": namespace, "name": f"{workflow_name}.{node_id}"}

    events = []
    for entry in graph.entries:
        output = dataset(entry.id)
        output["facets"] = {"version": {
            "_producer": PRODUCER,
            "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/DatasetVersionDatasetFacet.json"
                          "#/$defs/DatasetVersionDatasetFacet",
            "datasetVersion": str(entry.results_version)}}
        if entry.records_out is not None:
            output["outputFacets"] = {"outputStatistics": {
                "_producer": PRODUCER, "_schemaURL": OUTPUT_STATISTICS_FACET_SCHEMA, "rowCount": entry.records_out}}
        events.append({
            "eventType": _EVENT_TYPES.get(entry.status, "OTHER"),
            "eventTime": event_time,
            "run": {"runId": str(uuid.uuid5(parent_run, entry.id)), "facets": {"parent": {
                "_producer": PRODUCER, "_schemaURL": PARENT_RUN_FACET_SCHEMA,
                "run": {"runId": str(parent_run)}, "job": {"namespace": namespace, "name": workflow_name}}}},
            "job": {"namespace": namespace, "name": f"{workflow_name}.{entry.id}"},
            "inputs": [dataset(source) for source in parents.get(entry.id, [])],
            "outputs": [output],
            "producer": PRODUCER,
            "schemaURL": OPENLINEAGE_RUN_EVENT_SCHEMA,
        })
    return events
