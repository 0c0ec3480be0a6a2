"""The table_output node: passes records through; its sentence counts rows."""
from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.registry import describe


def test_table_output_passes_records_through_and_says_how_many_rows():
    assert run("table_output", {"columns": ["name"]}, PEOPLE) == PEOPLE
    assert describe("table_output", {"columns": ["name"]}, records_in=3, records_out=3) == (
        "Shows 3 rows as a table with columns name."
    )
