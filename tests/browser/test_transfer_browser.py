"""Kin export and import in Chromium: the kin page's Export button downloads the kin
document (with sessions when ticked), the kins page's import form turns that file into a
new kin whose memories and sessions are there, a second upload of the file opens the same
kin, and a broken file is refused with its problem named."""
import json

import pytest
from playwright.sync_api import expect

from kinsite.models import Kin
from memories.models import Memory
from sessions_app.models import Event
from tests.factories import KinFactory
from tests.transfer.conftest import build_full_kin

pytestmark = pytest.mark.browser


def test_export_a_kin_then_import_the_file_as_a_new_kin(logged_in_page, browser_team, tmp_path):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    build_full_kin(kin)

    page.goto(f"/kins/{kin.pk}/")
    page.get_by_label("with sessions and their messages").check()
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Export").click()
    download = download_info.value
    assert download.suggested_filename == f"kin-{kin.pk}-ada.kin.json"
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["format"] == "kinsite.kin" and document["includes_sessions"] is True

    page.goto("/kins/")
    page.set_input_files("#id_document", str(path))
    page.get_by_role("button", name="Import kin").click()
    expect(page.locator("main [role=status]")).to_have_text("Kin imported.")
    imported = Kin.objects.filter(team=browser_team).exclude(pk=kin.pk).get()
    assert page.url.endswith(f"/kins/{imported.pk}/?imported=new")
    expect(page.locator("h1")).to_have_text("Ada")
    expect(page.locator("main")).to_contain_text("Tea talk")
    assert Memory.objects.filter(kin=imported, content="Maria prefers green tea with lemon").exists()
    assert Event.objects.filter(session__kin=imported, content="Pumpkin soup, too").exists()

    # The same file again: the kin it made, nothing new.
    page.goto("/kins/")
    page.set_input_files("#id_document", str(path))
    page.get_by_role("button", name="Import kin").click()
    expect(page.locator("main [role=status]")).to_contain_text("This file was imported before")
    assert page.url.endswith(f"/kins/{imported.pk}/?imported=again")
    assert Kin.objects.filter(team=browser_team).count() == 2

    # A file cut in half: refused, its problem named, nothing stored.
    broken = tmp_path / "broken.json"
    broken.write_text(path.read_text(encoding="utf-8")[:500], encoding="utf-8")
    page.goto("/kins/")
    page.set_input_files("#id_document", str(broken))
    page.get_by_role("button", name="Import kin").click()
    expect(page.locator("#import-error")).to_contain_text("not a readable kin document")
    assert Kin.objects.filter(team=browser_team).count() == 2
