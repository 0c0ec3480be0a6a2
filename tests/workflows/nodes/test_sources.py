"""The sources that hold their records in their config: inline records and a CSV upload."""
from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.registry import describe


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
