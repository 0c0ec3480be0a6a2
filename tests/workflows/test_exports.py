"""Lineage exports: JSON, W3C PROV-JSON and OpenLineage run events keep the published
structure (required fields, checked with jsonschema against the parts of the published
schemas they use) and every reference inside them resolves."""
import json
import re
import uuid
from datetime import UTC, datetime

import jsonschema
import pytest

from workflows.lineage import (
    EdgeInfo,
    GraphInfo,
    NodeInfo,
    collect_lineage,
)
from workflows.lineage_exports import (
    OPENLINEAGE_RUN_EVENT_SCHEMA,
    lineage_to_json,
    lineage_to_openlineage,
    lineage_to_prov,
)

RUN_ID = "3f1c2b9e-8d7a-4c5b-9e6f-0a1b2c3d4e5f"
NAMESPACE = "https://kinsite.example/teams/3/workflows/7"

# The W3C PROV-JSON Member Submission's schema (https://www.w3.org/Submission/prov-json/schema),
# the sections and relations this export uses: no other top-level key, and each relation
# names what it must.
PROV_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "prefix": {"type": "object", "patternProperties": {"^[a-zA-Z0-9_\\-]+$": {"type": "string"}},
                   "additionalProperties": False},
        **{section: {"type": "object", "additionalProperties": {"type": "object"}}
           for section in ("entity", "activity", "agent")},
        "wasGeneratedBy": {"type": "object", "additionalProperties": {"required": ["prov:entity"]}},
        "used": {"type": "object", "additionalProperties": {"required": ["prov:activity"]}},
        "wasDerivedFrom": {"type": "object", "additionalProperties": {
            "required": ["prov:generatedEntity", "prov:usedEntity"]}},
        "wasAssociatedWith": {"type": "object", "additionalProperties": {"required": ["prov:activity"]}},
        **{section: {"type": "object"} for section in (
            "wasInformedBy", "wasStartedBy", "wasEndedBy", "wasInvalidatedBy", "wasAttributedTo",
            "actedOnBehalfOf", "wasInfluencedBy", "specializationOf", "alternateOf", "hadMember", "bundle")},
    },
}

# OpenLineage 2-0-2 (https://openlineage.io/spec/2-0-2/OpenLineage.json): BaseEvent, RunEvent,
# Run, Job, datasets and BaseFacet, with their required fields.
BASE_FACET = {"type": "object", "required": ["_producer", "_schemaURL"],
              "properties": {"_producer": {"type": "string", "format": "uri"},
                             "_schemaURL": {"type": "string", "format": "uri"}}}
DATASET = {"type": "object", "required": ["namespace", "name"],
           "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                          "facets": {"type": "object", "additionalProperties": BASE_FACET},
                          "inputFacets": {"type": "object", "additionalProperties": BASE_FACET},
                          "outputFacets": {"type": "object", "additionalProperties": BASE_FACET}}}
RUN_EVENT_SCHEMA = {
    "type": "object",
    "required": ["eventTime", "producer", "schemaURL", "run", "job"],
    "properties": {
        "eventType": {"enum": ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]},
        "eventTime": {"type": "string", "format": "date-time"},
        "producer": {"type": "string", "format": "uri"},
        "schemaURL": {"type": "string", "format": "uri"},
        "run": {"type": "object", "required": ["runId"],
                "properties": {"runId": {"type": "string", "format": "uuid"},
                               "facets": {"type": "object", "additionalProperties": BASE_FACET}}},
        "job": {"type": "object", "required": ["namespace", "name"],
                "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                               "facets": {"type": "object", "additionalProperties": BASE_FACET}}},
        "inputs": {"type": "array", "items": DATASET},
        "outputs": {"type": "array", "items": DATASET},
    },
}


def node(node_id, type, status="done", **fields):
    values = {"label": node_id.title(), "records_in": 10, "records_out": 8, "results_version": 2,
              "config_fingerprint": "fp", "current_fingerprint": "fp"}
    values.update(fields)
    return NodeInfo(id=node_id, type=type, status=status, **values)


@pytest.fixture
def diamond():
    nodes = [
        node("people", "csv_upload", records_in=None, records_out=120, config={"file": "people.csv"}),
        node("adults", "filter", config={"field": "age", "op": ">=", "value": 18, "extra": {"a": [1]}}),
        node("renamed", "transform", status="failed"),
        node("domains", "transform", status="running"),
        node("both merged", "merge", status="skipped", results_version=0, config_fingerprint="",
             records_in=None, records_out=None),
    ]
    edges = [EdgeInfo("people", "adults"), EdgeInfo("adults", "renamed"), EdgeInfo("adults", "domains"),
             EdgeInfo("renamed", "both merged"), EdgeInfo("domains", "both merged")]
    return collect_lineage(GraphInfo(nodes=nodes, edges=edges), "both merged")


def test_json_export_is_plain_json(diamond):
    data = json.loads(json.dumps(lineage_to_json(diamond)))
    assert data["node"] == "both merged"
    assert data["stale"] is True
    assert data["stale_reasons"] == ["Both Merged never ran"]
    assert [e["id"] for e in data["entries"]] == ["people", "adults", "renamed", "domains", "both merged"]
    assert data["entries"][1]["params"]["field"] == "age"
    assert data["entries"][0]["records_out"] == 120
    assert data["edges"][0] == {"source": "people", "target": "adults"}
    ids = {e["id"] for e in data["entries"]}
    assert all(edge["source"] in ids and edge["target"] in ids for edge in data["edges"])


# --- PROV-JSON --------------------------------------------------------------------------

QNAME = re.compile(r"^(_|[A-Za-z][A-Za-z0-9_\-]*):[^\s]+$")


def test_prov_document_has_the_published_structure(diamond):
    doc = json.loads(json.dumps(lineage_to_prov(diamond, workflow_name="Onboarding", namespace=NAMESPACE)))
    jsonschema.validate(doc, PROV_SCHEMA)
    assert doc["prefix"]["kinsite"] == NAMESPACE + "/"
    assert len(doc["entity"]) == len(doc["activity"]) == len(diamond.entries)
    assert len(doc["wasGeneratedBy"]) == len(diamond.entries)
    assert len(doc["used"]) == len(doc["wasDerivedFrom"]) == len(diamond.edges)


def test_prov_ids_use_declared_prefixes_and_every_reference_resolves(diamond):
    doc = lineage_to_prov(diamond, workflow_name="Onboarding", namespace=NAMESPACE)
    declared = set(doc["prefix"]) | {"prov", "xsd", "_"}
    nodes = set(doc["entity"]) | set(doc["activity"]) | set(doc["agent"])
    for identifier in nodes | {r for section in ("used", "wasGeneratedBy", "wasDerivedFrom",
                                                 "wasAssociatedWith") for r in doc[section]}:
        assert QNAME.match(identifier), identifier
        assert identifier.split(":")[0] in declared, identifier
    for section in ("entity", "activity", "agent"):
        for attributes in doc[section].values():
            for key in attributes:
                assert key.split(":")[0] in declared, key
    refs = {"prov:entity": "entity", "prov:activity": "activity", "prov:agent": "agent",
            "prov:generatedEntity": "entity", "prov:usedEntity": "entity"}
    for section in ("used", "wasGeneratedBy", "wasDerivedFrom", "wasAssociatedWith"):
        for relation in doc[section].values():
            for key, target in relation.items():
                assert target in doc[refs[key]], (section, key, target)


def test_prov_records_versions_counts_types_and_params(diamond):
    doc = lineage_to_prov(diamond, workflow_name="Onboarding", namespace=NAMESPACE)
    people = doc["entity"]["kinsite:results.people"]
    assert people["kinsite:resultsVersion"] == 2
    assert people["kinsite:recordCount"] == 120
    merged = doc["entity"]["kinsite:results.both_20merged"]
    assert merged["kinsite:resultsVersion"] == 0 and "kinsite:recordCount" not in merged
    adults = doc["activity"]["kinsite:run.adults"]
    assert adults["prov:type"] == {"$": "kinsite:filter", "type": "xsd:QName"}
    assert adults["prov:label"] == "Adults"
    assert (adults["param:field"], adults["param:op"], adults["param:value"]) == ("age", ">=", 18)
    assert json.loads(adults["param:extra"]) == {"a": [1]}
    used = [(u["prov:activity"], u["prov:entity"]) for u in doc["used"].values()]
    assert ("kinsite:run.adults", "kinsite:results.people") in used
    derived = [(d["prov:generatedEntity"], d["prov:usedEntity"]) for d in doc["wasDerivedFrom"].values()]
    assert ("kinsite:results.both_20merged", "kinsite:results.renamed") in derived


# --- OpenLineage ------------------------------------------------------------------------

def openlineage(lineage, event_time=datetime(2026, 12, 2, 14, 0, tzinfo=UTC)):
    return lineage_to_openlineage(lineage, workflow_name="onboarding", namespace="kinsite://team-3",
                                  run_id=RUN_ID, event_time=event_time)


def test_openlineage_events_validate_against_the_run_event_structure(diamond):
    events = json.loads(json.dumps(openlineage(diamond)))
    assert len(events) == len(diamond.entries)
    checker = jsonschema.FormatChecker()
    for event in events:
        jsonschema.validate(event, RUN_EVENT_SCHEMA, format_checker=checker)
        assert event["schemaURL"] == OPENLINEAGE_RUN_EVENT_SCHEMA
        assert event["producer"].startswith("https://")
        assert datetime.fromisoformat(event["eventTime"]) == datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
        uuid.UUID(event["run"]["runId"])
        parent = event["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == RUN_ID
        assert parent["job"] == {"namespace": "kinsite://team-3", "name": "onboarding"}


def test_openlineage_event_types_follow_node_status(diamond):
    types = {event["job"]["name"]: event["eventType"] for event in openlineage(diamond)}
    assert types == {"onboarding.people": "COMPLETE", "onboarding.adults": "COMPLETE",
                     "onboarding.renamed": "FAIL", "onboarding.domains": "START",
                     "onboarding.both merged": "ABORT"}


def test_openlineage_inputs_are_outputs_of_earlier_events(diamond):
    events = openlineage(diamond)
    produced = set()
    for event in events:
        for dataset in event["inputs"]:
            assert (dataset["namespace"], dataset["name"]) in produced
        (output,) = event["outputs"]
        produced.add((output["namespace"], output["name"]))
    by_job = {event["job"]["name"]: event for event in events}
    assert [d["name"] for d in by_job["onboarding.both merged"]["inputs"]] == ["onboarding.renamed",
                                                                                "onboarding.domains"]
    assert by_job["onboarding.people"]["inputs"] == []
    stats = by_job["onboarding.people"]["outputs"][0]["outputFacets"]["outputStatistics"]
    assert stats["rowCount"] == 120
    assert "outputFacets" not in by_job["onboarding.both merged"]["outputs"][0]
    assert len({event["run"]["runId"] for event in events}) == len(events)


def test_openlineage_run_ids_are_stable_and_naive_times_are_utc(diamond):
    first = openlineage(diamond, event_time=datetime(2026, 12, 2, 14, 0))
    again = openlineage(diamond, event_time="2026-12-02T14:00:00+00:00")
    assert [e["run"]["runId"] for e in first] == [e["run"]["runId"] for e in again]
    assert first[0]["eventTime"] == "2026-12-02T14:00:00+00:00"
    assert again[0]["eventTime"] == "2026-12-02T14:00:00+00:00"
