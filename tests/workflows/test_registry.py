"""Each built-in node type: its runner on plain records, its parameter checks, and its
describer's sentence (real parameters and counts)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kinsite.llm.providers import ScriptedProvider, provider_override
from workflows.nodes import NODE_TYPES, NodeError, RunContext, describe, llm, validate_params

PEOPLE = [
    {"id": 1, "name": "Ada", "city": "London", "age": 36, "email": "ada@example.org"},
    {"id": 2, "name": "Bo", "city": "Paris", "age": "17", "email": "bo@example.org"},
    {"id": 3, "name": "Cy", "city": "Paris", "age": 52, "email": "ada@example.org"},
]


def run(node_type, config, *inputs, ctx=None):
    assert validate_params(NODE_TYPES[node_type], config) == []
    return NODE_TYPES[node_type].run(ctx or RunContext(), config, list(inputs))


# --- sources -------------------------------------------------------------------------


def test_inline_records_source_and_sentence():
    config = {"records": PEOPLE}

    assert run("inline_records", config) == PEOPLE
    assert describe("inline_records", config, records_out=3) == (
        "Provides 3 inline records with fields id, name, city, age, email (3 records out)."
    )


def test_csv_upload_parses_with_the_csv_module():
    config = {"csv": 'id,name,note\n1,Ada,"likes, commas"\n2,Bo,\n'}

    records = run("csv_upload", config)

    assert records == [{"id": "1", "name": "Ada", "note": "likes, commas"}, {"id": "2", "name": "Bo", "note": ""}]
    assert describe("csv_upload", config, records_out=2) == (
        "Reads an uploaded CSV of 2 rows with columns id, name, note (2 records out)."
    )


class _JSONHandler(BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        status, body = self.routes.get(self.path, (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def json_server():
    handler = type("Handler", (_JSONHandler,), {"routes": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield handler.routes, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_json_source_reads_records_at_a_path(json_server, settings):
    # Loopback is refused unless allowed (tests/workflows/test_http_source.py); the test server is.
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    routes, base = json_server
    routes["/people"] = (200, json.dumps({"data": {"items": PEOPLE[:2]}}).encode())
    config = {"url": f"{base}/people", "path": "data.items"}

    assert run("http_json", config) == PEOPLE[:2]
    assert describe("http_json", config, records_out=2) == (
        f"Fetches JSON from {base}/people at path data.items (2 records out)."
    )


def test_http_json_source_reports_http_errors_and_size_cap(json_server, settings):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WORKFLOW_HTTP_MAX_BYTES = 100
    routes, base = json_server
    routes["/big"] = (200, json.dumps([{"x": "y" * 100}] * 10).encode())

    # Both read alike, on purpose: the reason goes to the server log only.
    with pytest.raises(NodeError, match=f"Could not fetch JSON from {base}/missing: .* 100 bytes"):
        run("http_json", {"url": f"{base}/missing"})
    with pytest.raises(NodeError, match=f"Could not fetch JSON from {base}/big: .* 100 bytes"):
        run("http_json", {"url": f"{base}/big"})


def test_http_json_source_refuses_non_http_urls():
    assert validate_params(NODE_TYPES["http_json"], {"url": "file:///etc/passwd"}) == [
        "'url' must be an http:// or https:// address."
    ]


# --- steps ---------------------------------------------------------------------------


def test_filter_with_and_compares_numbers_as_numbers():
    config = {"conditions": [{"field": "city", "op": "eq", "value": "Paris"}, {"field": "age", "op": "gte", "value": 18}]}

    assert [r["id"] for r in run("filter", config, PEOPLE)] == [3]
    assert describe("filter", config, records_in=3, records_out=1) == (
        'Keeps records where city = "Paris" and age ≥ 18 (3 in, 1 out).'
    )


@pytest.mark.parametrize(
    "condition, ids",
    [
        ({"field": "city", "op": "ne", "value": "Paris"}, [1]),
        ({"field": "age", "op": "lt", "value": 20}, [2]),
        ({"field": "name", "op": "contains", "value": "d"}, [1]),
        ({"field": "name", "op": "in", "value": ["Bo", "Cy"]}, [2, 3]),
        ({"field": "missing", "op": "exists"}, []),
        ({"field": "missing", "op": "exists", "value": False}, [1, 2, 3]),
        ({"field": "age", "op": "gt", "value": 40}, [3]),
        ({"field": "age", "op": "lte", "value": 36}, [1, 2]),
    ],
)
def test_filter_operators(condition, ids):
    assert [r["id"] for r in run("filter", {"conditions": [condition]}, PEOPLE)] == ids


def test_filter_with_or():
    config = {
        "conditions": [{"field": "city", "op": "eq", "value": "London"}, {"field": "age", "op": "gt", "value": 50}],
        "combine": "or",
    }
    assert [r["id"] for r in run("filter", config, PEOPLE)] == [1, 3]


def test_transform_renames_and_extracts():
    config = {"rename": {"name": "full_name"}, "extract": {"field": "email", "pattern": r"@(.+)$", "into": "domain"}}

    records = run("transform", config, PEOPLE[:1])

    assert records == [{**{k: v for k, v in PEOPLE[0].items() if k != "name"}, "full_name": "Ada", "domain": "example.org"}]
    assert describe("transform", config, records_in=1, records_out=1) == (
        'Renames name → full_name and extracts domain from email with pattern "@(.+)$" (1 in, 1 out).'
    )


def test_deduplicate_keeps_the_first_by_field():
    config = {"fields": ["email"]}

    assert [r["id"] for r in run("deduplicate", config, PEOPLE)] == [1, 2]
    assert describe("deduplicate", config, records_in=3, records_out=2) == (
        "Removes duplicates by email, keeping the first of each (3 in, 2 out)."
    )


def test_merge_inner_and_left_join_on_key():
    orders = [{"id": 1, "total": 10}, {"id": 1, "total": 5}, {"id": 9, "total": 1}]

    inner = run("merge", {"key": "id", "how": "inner"}, PEOPLE, orders)
    left = run("merge", {"key": "id", "how": "left"}, PEOPLE, orders)

    assert [(r["name"], r["total"]) for r in inner] == [("Ada", 10), ("Ada", 5)]
    assert [(r["name"], r.get("total")) for r in left] == [("Ada", 10), ("Ada", 5), ("Bo", None), ("Cy", None)]
    assert describe("merge", {"key": "id", "how": "left"}, records_in=6, records_out=4) == (
        "Joins its two inputs on id with a left join (6 in, 4 out)."
    )


def test_table_output_passes_records_through_and_says_how_many_rows():
    assert run("table_output", {"columns": ["name"]}, PEOPLE) == PEOPLE
    assert describe("table_output", {"columns": ["name"]}, records_in=3, records_out=3) == (
        "Shows 3 rows as a table with columns name."
    )


def test_unknown_type_gets_the_generic_sentence():
    assert describe("pivot", {"x": 1}, label="Pivot by city", records_in=3, records_out=2) == (
        '"Pivot by city" of unknown type pivot (3 in, 2 out).'
    )
    assert describe("pivot", {}, label="") == "A node of unknown type pivot (not run yet)."


# --- LLM steps (scripted provider) -----------------------------------------------------------


@pytest.mark.django_db
def test_llm_inference_renders_fields_and_lineage_per_record():
    provider = ScriptedProvider(["first answer", "second answer"])
    lineage_calls = []

    def lineage():
        lineage_calls.append(1)
        return "1. Provides 2 records."

    config = {"prompt": "About {{name}} ({{ city }}). How they came here: {{_lineage}}", "output_field": "summary"}
    with provider_override(provider):
        records = run("llm_inference", config, PEOPLE[:2], ctx=RunContext(lineage=lineage))

    assert [r["summary"] for r in records] == ["first answer", "second answer"]
    assert provider.calls[0].messages[-1]["content"] == "About Ada (London). How they came here: 1. Provides 2 records."
    assert describe("llm_inference", config, records_in=2, records_out=2) == (
        'Asks the model once per record with the prompt "About {{name}} ({{ city }}). How they came here: '
        '{{_lineage}}" and writes the answer to summary (2 in, 2 out).'
    )


def test_llm_inference_refuses_malformed_placeholders_and_too_many_records():
    assert validate_params(NODE_TYPES["llm_inference"], {"prompt": "Hi {{ name"}) == [
        "'prompt' has a malformed placeholder '{{'; use {{field}} or {{_lineage}}."
    ]
    with pytest.raises(NodeError, match="3 model calls; this node allows 2"):
        run("llm_inference", {"prompt": "x", "max_records": 2}, PEOPLE)


@pytest.mark.django_db
def test_llm_smart_filter_stores_generated_conditions_and_reuses_them():
    answer = {"conditions": [{"field": "age", "op": "gte", "value": 18}], "combine": "and", "explanation": "Adults."}
    provider = ScriptedProvider([json.dumps(answer)])
    saved = {}
    config = {"instruction": "only adults"}

    with provider_override(provider):
        records = run("llm_smart_filter", config, PEOPLE, ctx=RunContext(save_config=saved.update))
        again = NODE_TYPES["llm_smart_filter"].run(RunContext(), dict(saved), [PEOPLE])

    assert [r["id"] for r in records] == [1, 3] == [r["id"] for r in again]
    assert len(provider.calls) == 1  # the second run reused the stored conditions
    assert provider.calls[0].json_mode
    assert saved["generated"]["conditions"] == answer["conditions"]
    assert saved["generated"]["explanation"] == "Adults."
    assert describe("llm_smart_filter", saved, records_in=3, records_out=2) == (
        'Filters by the instruction "only adults", which the model read as age ≥ 18 (3 in, 2 out).'
    )


@pytest.mark.django_db
def test_llm_smart_filter_fails_on_unusable_conditions():
    provider = ScriptedProvider([json.dumps({"conditions": [{"field": "age", "op": "between"}]})])
    with provider_override(provider), pytest.raises(NodeError, match="unusable"):
        run("llm_smart_filter", {"instruction": "middle aged"}, PEOPLE)


# --- the schema ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_type, config, message",
    [
        ("filter", {"conditions": [{"field": "a", "op": "like", "value": 1}]}, "op 'like'"),
        ("filter", {"conditions": []}, "non-empty list"),
        ("filter", {"conditions": [{"field": "a", "op": "eq", "value": 1}], "combine": "xor"}, "one of and, or"),
        ("transform", {"extract": {"field": "a", "pattern": "(", "into": "b"}}, "not a valid regular expression"),
        ("deduplicate", {}, "parameter 'fields' is required"),
        ("merge", {"key": "id", "how": "outer"}, "must be one of inner, left"),
        ("inline_records", {"records": [1, 2]}, "must be a JSON object"),
        ("csv_upload", {"csv": 3}, "must be a string"),
        ("table_output", {"colums": ["a"]}, "unknown parameter 'colums'"),
    ],
)
def test_bad_params_are_named(node_type, config, message):
    errors = validate_params(NODE_TYPES[node_type], config)
    assert any(message in error for error in errors), errors


# --- untrusted patterns and numbers (issue 14) --------------------------------------------------


def test_transform_extract_runs_a_catastrophic_pattern_in_linear_time():
    # With a backtracking engine (Python's re) this search tries about 2**40 ways to split the
    # a's before giving up: hours of one worker. A linear-time engine answers at once.
    config = {"extract": {"field": "text", "pattern": r"(a+)+$", "into": "tail"}}

    records = run("transform", config, [{"text": "a" * 40 + "!"}, {"text": "baaa"}])

    assert [record["tail"] for record in records] == [None, "aaa"]


@pytest.mark.parametrize(
    "pattern, problem",
    [
        (r"(\w+) \1", "backreference"),
        (r"price(?= EUR)", "lookaround"),
        (r"(?<!not )sure", "lookaround"),
    ],
)
def test_transform_refuses_patterns_a_linear_time_engine_cannot_run(pattern, problem):
    errors = validate_params(NODE_TYPES["transform"], {"extract": {"field": "a", "pattern": pattern, "into": "b"}})

    assert len(errors) == 1, errors
    assert errors[0].startswith(f"extract 1: pattern {pattern!r} is not supported"), errors
    assert problem in errors[0]


def test_llm_prompt_placeholder_check_is_linear_and_the_prompt_is_bounded():
    # A backtracking scan for "{{…}}" retried from every "{{" is quadratic on a long line.
    prompt = "{{" * 5_000 + "x"
    errors = validate_params(NODE_TYPES["llm_inference"], {"prompt": prompt})
    assert errors == ["'prompt' has a malformed placeholder '{{'; use {{field}} or {{_lineage}}."]
    too_long = validate_params(NODE_TYPES["llm_inference"], {"prompt": "x" * (llm.PROMPT_MAX_CHARS + 1)})
    assert too_long == [f"'prompt' is {llm.PROMPT_MAX_CHARS + 1} characters; the limit is "
                        f"{llm.PROMPT_MAX_CHARS}."]


def test_filter_compares_huge_integers_and_odd_number_text_without_overflow():
    records = [
        {"id": 1, "n": 10**400},  # inline records may hold any JSON integer
        {"id": 2, "n": "9007199254740993"},  # 2**53 + 1: exact, not rounded through a float
        {"id": 3, "n": "nan"},  # not a number: compared as text, never "equal" to everything
        {"id": 4, "n": "5"},
        {"id": 5, "n": "1" + "0" * 5000},  # past int()'s digit limit: read as a float (inf)
    ]

    def ids(op, value):
        return [r["id"] for r in run("filter", {"conditions": [{"field": "n", "op": op, "value": value}]}, records)]

    assert ids("gt", 10) == [1, 2, 3, 5]
    assert ids("eq", 9007199254740992) == []
    assert ids("eq", 9007199254740993) == [2]
    assert ids("lte", 5) == [4]
    assert ids("ne", 5) == [1, 2, 3, 5]


@pytest.mark.parametrize(
    "node_type, config, message",
    [
        ("filter", {"conditions": [{"field": "n", "op": "gt", "value": 10**400}]},
         "condition 1: the number 1000000000000000000000…"),
        ("filter", {"conditions": [{"field": "n", "op": "in", "value": [1, -(10**30)]}]},
         "condition 1: the number -100000000000000000000…"),
        ("filter", {"conditions": [{"field": "n", "op": "lt", "value": 1e300}]}, "condition 1: the number 1e+300"),
        ("llm_inference", {"prompt": "x", "temperature": 1e300}, "'temperature' must be between 0 and 2"),
        ("llm_inference", {"prompt": "x", "temperature": -1}, "'temperature' must be between 0 and 2"),
        ("llm_inference", {"prompt": "x", "max_records": 10**400}, "'max_records' must be between 1 and 5000"),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": "\n"}, "'delimiter' cannot be a line break or a quote"),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": '"'}, "'delimiter' cannot be a line break or a quote"),
    ],
)
def test_absurd_numbers_and_delimiters_are_named(node_type, config, message):
    errors = validate_params(NODE_TYPES[node_type], config)
    assert any(message in error for error in errors), errors


@pytest.mark.parametrize(
    "node_type, config",
    [
        ("llm_inference", {"prompt": "x", "max_records": None, "temperature": None}),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": None}),
        ("filter", {"conditions": [{"field": "n", "op": "eq", "value": 1}], "combine": None}),
        ("filter", {"conditions": [{"field": "n", "op": "lt", "value": 9_007_199_254_740_993}]}),
    ],
)
def test_null_optional_params_mean_their_default(node_type, config):
    assert validate_params(NODE_TYPES[node_type], config) == []
