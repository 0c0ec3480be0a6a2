"""In a real browser: the New kin form is laid out as the other dashboard forms (the New
session form, the memory form), and an empty session shows its "No messages yet" line
with no blank box above it."""
import pytest
from playwright.sync_api import expect

from tests.factories import KinFactory, MessageFactory, SessionFactory

pytestmark = pytest.mark.browser

LINE_COLOUR = "rgb(223, 227, 234)"  # --line in dashboard.css
STYLE = """el => { const s = getComputedStyle(el); return {
  display: s.display, font: s.font, color: s.color, border: s.border, borderRadius: s.borderRadius,
  padding: s.padding, width: el.getBoundingClientRect().width, height: el.getBoundingClientRect().height}; }"""


def style(page, selector: str) -> dict:
    return page.locator(selector).first.evaluate(STYLE)


def test_the_new_kin_form_is_laid_out_as_the_other_forms(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")

    page.goto(f"/kins/{kin.pk}/sessions/new/")
    session_form = {
        "input": style(page, "#id_title"),
        "label": style(page, "label[for=id_title]"),
        "help": style(page, "#id_title_helptext"),
    }
    page.goto(f"/kins/{kin.pk}/memories/add/")
    memory_label = style(page, "label[for=id_content]")

    page.goto("/kins/new/")
    expect(page.locator("h1")).to_have_text("New kin")
    assert "memory-form" in page.locator("form.kin-form").get_attribute("class")
    # A field without help text (Name) and one with (Role) both put the label above the input.
    for field in ("name", "role", "model"):
        assert style(page, f"#id_{field}") == session_form["input"], field
        assert style(page, f"label[for=id_{field}]")["display"] == session_form["label"]["display"] == "block"
    assert style(page, "label[for=id_name]")["font"] == memory_label["font"]
    help_text = style(page, "#id_role_helptext")
    assert (help_text["color"], help_text["font"]) == (session_form["help"]["color"], session_form["help"]["font"])
    assert help_text["color"] != style(page, "label[for=id_role]")["color"]  # muted, as a hint
    # The per-kin settings box is drawn as the dashboard's other boxes, not the browser's groove.
    fieldset = page.locator("form.kin-form fieldset").evaluate(
        "el => { const s = getComputedStyle(el); return [s.borderTopStyle, s.borderTopColor, s.backgroundColor]; }")
    assert fieldset == ["solid", LINE_COLOUR, "rgb(255, 255, 255)"]
    assert style(page, "#id_introspection__turn_interval")["width"] == session_form["input"]["width"]


def conversation_box(page) -> dict:
    return page.evaluate("""() => {
      const box = el => el.getBoundingClientRect();
      const scroll = document.querySelector('.chat-scroll'), list = document.querySelector('#conversation');
      return {scroll: box(scroll).height, list: box(list).height};
    }""")


def test_an_empty_session_shows_its_hint_and_no_blank_box(logged_in_page, browser_team):
    page = logged_in_page
    kin = KinFactory(team=browser_team, name="Ada")
    empty = SessionFactory(kin=kin, title="Nothing yet")

    page.goto(f"/sessions/{empty.pk}/")
    hint = page.locator("#conversation .empty")
    expect(hint).to_be_visible()
    expect(hint).to_contain_text("No messages yet")
    sizes = conversation_box(page)
    # The scroll box is as tall as the hint line: no empty space above it.
    assert sizes["scroll"] - sizes["list"] < 2
    assert sizes["scroll"] < 60
    # Nothing visible in the conversation area is an empty box.
    empty_boxes = page.evaluate("""() => [...document.querySelectorAll('.chat .chat-scroll, .chat .chat-scroll *')]
      .filter(el => el.getBoundingClientRect().height > 0 && !el.textContent.trim()).map(el => el.outerHTML)""")
    assert empty_boxes == []

    # With messages, the scroll box keeps its height for the conversation to grow into.
    full = SessionFactory(kin=kin, title="Talked")
    MessageFactory(session=full, content="Hello")
    page.goto(f"/sessions/{full.pk}/")
    expect(page.locator("#conversation .empty")).to_be_hidden()
    assert conversation_box(page)["scroll"] >= 150
