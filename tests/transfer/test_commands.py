"""manage.py export_kin and import_kin: a file round trip between teams, the second import
of a file reporting the first kin, and clear errors that change nothing."""
import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from kinsite.models import Kin
from sessions_app.models import Event
from tests.transfer.conftest import normalise, table_counts
from transfer.selectors import kin_export_document


@pytest.fixture(autouse=True)
def private_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"transfer-commands-{uuid.uuid4()}"}}


def test_export_to_a_file_and_import_into_another_team(full_kin, other_team, tmp_path):
    path = tmp_path / "ada.kin.json"
    err = StringIO()
    call_command("export_kin", str(full_kin.pk), "--sessions", "-o", str(path), stderr=err)
    assert f"Wrote kin {full_kin.pk}" in err.getvalue()
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["includes_sessions"] is True and document["events"]

    out = StringIO()
    call_command("import_kin", str(path), "--team", other_team.slug, stdout=out)
    kin = Kin.objects.get(team=other_team)
    assert out.getvalue().strip() == f"Imported kin {kin.pk} ({kin.name}) into team {other_team.slug}."
    assert Event.objects.filter(session__kin=kin).count() == len(document["events"])
    assert normalise(json.loads(json.dumps(kin_export_document(kin=kin, include_sessions=True)))) == normalise(document)

    counts = table_counts()
    out = StringIO()
    call_command("import_kin", str(path), "--team", other_team.slug, stdout=out)
    assert out.getvalue().startswith(f"Already imported: kin {kin.pk}")
    assert table_counts() == counts


def test_export_to_stdout_leaves_sessions_out_by_default(full_kin):
    out = StringIO()
    call_command("export_kin", str(full_kin.pk), stdout=out)
    document = json.loads(out.getvalue())
    assert document["kin"]["id"] == full_kin.pk and document["sessions"] == []


def test_export_of_an_unknown_kin_is_an_error(db):
    with pytest.raises(CommandError, match="No kin with id 4242"):
        call_command("export_kin", "4242")


def test_import_of_a_truncated_file_names_the_problem_and_writes_nothing(full_kin, other_team, tmp_path):
    text = json.dumps(kin_export_document(kin=full_kin))
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    counts = table_counts()
    with pytest.raises(CommandError, match="not a readable kin document: JSON parse error"):
        call_command("import_kin", str(path), "--team", other_team.slug)
    assert table_counts() == counts


def test_import_of_an_invalid_document_lists_every_problem(full_kin, other_team, tmp_path):
    document = json.loads(json.dumps(kin_export_document(kin=full_kin)))
    document["memories"][0]["importance"] = 0
    document["facts"][0]["category"] = "rumour"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    counts = table_counts()
    with pytest.raises(CommandError) as caught:
        call_command("import_kin", str(path), "--team", other_team.slug)
    message = str(caught.value)
    assert "memories[0].importance" in message and "facts[0].category" in message
    assert table_counts() == counts


def test_import_needs_a_known_team_and_a_readable_file(full_kin, tmp_path):
    with pytest.raises(CommandError, match="No team with slug 'nobody'"):
        call_command("import_kin", str(tmp_path / "x.json"), "--team", "nobody")
    with pytest.raises(CommandError, match="Could not read"):
        call_command("import_kin", str(tmp_path / "missing.json"), "--team", full_kin.team.slug)
