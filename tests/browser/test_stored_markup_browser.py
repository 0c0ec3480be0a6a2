"""The pages holding stored markup, in Chromium: no script of the stored text runs, on a
full page load or after an htmx swap, and no dialog opens (tests/abuse/markup.py writes
`<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">` into every text)."""
import pytest
from django.urls import reverse
from playwright.sync_api import expect

from tests.abuse.markup import HTML_PAYLOAD, build_markup_world

pytestmark = pytest.mark.browser


def test_pages_with_stored_markup_run_none_of_it(logged_in_page, browser_team, browser_user):
    page = logged_in_page
    world = build_markup_world(team=browser_team, user=browser_user, payload=HTML_PAYLOAD)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    urls = [
        reverse("dashboard:kins"),
        reverse("dashboard:kin_detail", args=[world.kin.pk]),
        reverse("dashboard:session_detail", args=[world.session.pk]),
        reverse("dashboard:session_prompt_preview", args=[world.session.pk]) + "?message=hello",
        reverse("dashboard:memory_list", args=[world.kin.pk]),
        reverse("dashboard:memory_detail", args=[world.kin.pk, world.memory.pk]),
        reverse("dashboard:memory_edit", args=[world.kin.pk, world.memory.pk]),
        reverse("dashboard:experience", args=[world.kin.pk]) + f"?run={world.run.pk}",
        reverse("dashboard:fact_list", args=[world.kin.pk]),
        reverse("dashboard:workflows"),
        reverse("dashboard:workflow_detail", args=[world.workflow.pk]),
        reverse("dashboard:workflow_node", args=[world.workflow.pk, world.node.client_id]),
        reverse("dashboard:tokens"),
    ]
    for url in urls:
        response = page.goto(url, wait_until="load")
        assert response.status == 200, url
        # The stored text is on the page, as text.
        expect(page.locator("body")).to_contain_text("<script>window.__pwned=1</script>")
        for details in page.locator("details").all():  # folded tool calls, prompts, sections
            details.evaluate("element => element.open = true")
        assert page.evaluate("typeof window.__pwned") == "undefined", url

    # htmx swaps run the scripts of what they swap in: the kin search and the chat page's
    # prompt preview swap in rows and sections holding the stored markup.
    page.goto(reverse("dashboard:kins"), wait_until="load")
    page.evaluate("window.__swapped = false; document.body.addEventListener('htmx:afterSwap', "
                  "() => { window.__swapped = true; })")
    page.fill("#kin-search", "m")
    page.wait_for_function("window.__swapped === true")
    expect(page.locator("#kin-rows")).to_contain_text("window.__pwned")
    page.goto(reverse("dashboard:session_detail", args=[world.session.pk]), wait_until="load")
    page.fill("#chat-content", "What is new?")
    expect(page.locator("#prompt-preview, .prompt-preview").first).to_contain_text("window.__pwned")
    page.wait_for_timeout(300)  # an <img onerror> would fire once the failed load settles

    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert dialogs == []
