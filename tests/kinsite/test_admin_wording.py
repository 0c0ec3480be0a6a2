"""The admin's wording, walked as staff over every registered model's list, add and change
pages with the demo data: plurals ("Memories"), acronyms in labels and choices ("API",
"LLM", "ID", "OK"), app names, and "an" before a vowel ("an introspection template")."""
import html
import re
from io import StringIO

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

OUR_APPS = {"kinsite", "sessions_app", "memories", "consolidation", "workflows", "transfer"}
# What admin and the apps generate around the data: titles, headings, column and filter
# titles, field labels, choices, buttons and links. (Stored text, e.g. "customer id" in a
# demo message, may say what it likes; it shows in cells and read-only values, not here.)
WORDING_ELEMENTS = re.compile(r"<(title|h1|h2|h3|caption|th|label|summary|option|button)\b[^>]*>(.*?)</\1>", re.S)
NAIVE_PLURAL = re.compile(r"\b\w+[^aeiou\W]ys\b", re.I)  # "Memorys", "Summarys"
# "a" before a vowel ("a introspection"); words in "u" are left out ("a user", "a unique").
A_BEFORE_VOWEL = re.compile(r"\ba [aeio]\w*", re.I)
UNCAPITALISED_ACRONYM = re.compile(r"\b(Api|Llm|Url|Ok|Json|Whatsapp|id|ids|Id|Ids)\b|(?<!\()\bms\b")
# A list filter's choices: links in the filter sidebar.
FILTER_CHOICE = re.compile(r'<li[^>]*>\s*<a href="\?[^"]*">(.*?)</a>', re.S)


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def demo(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        call_command("create_demo", stdout=StringIO())


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def wording(page: str) -> list[str]:
    filters = page.split('id="changelist-filter"', 1)[1] if 'id="changelist-filter"' in page else ""
    texts = [_text(inner) for _, inner in WORDING_ELEMENTS.findall(page)] + [
        _text(inner) for inner in FILTER_CHOICE.findall(filters)]
    return [text for text in texts if text]


def admin_pages(client) -> dict[str, str]:
    """Every page of our apps' registered models that staff may open: list, add, and the
    change (or view) page of the first row."""
    pages = {"index": client.get(reverse("admin:index")).content.decode()}
    for model in admin.site._registry:
        meta = model._meta
        if meta.app_label not in OUR_APPS:
            continue
        urls = [reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"),
                reverse(f"admin:{meta.app_label}_{meta.model_name}_add")]
        first = model.objects.order_by("pk").first()
        if first is not None:
            urls.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first.pk]))
        for url in urls:
            response = client.get(url)
            assert response.status_code in (200, 403), url  # 403: the add page of a read-only log
            if response.status_code == 200:
                pages[url] = response.content.decode()
    return pages


def test_admin_wording_has_no_naive_plurals_articles_or_lowercase_acronyms(staff_client, demo):
    pages = admin_pages(staff_client)
    assert len(pages) > 40
    problems = {}
    for url, page in pages.items():
        for text in wording(page):
            found = (NAIVE_PLURAL.findall(text) + A_BEFORE_VOWEL.findall(text)
                     + [match[0] for match in UNCAPITALISED_ACRONYM.finditer(text)])
            if found:
                problems.setdefault(url, []).append((text, found))
    assert problems == {}


def test_admin_names_models_apps_and_choices_as_people_write_them(staff_client, demo):
    index = wording(staff_client.get(reverse("admin:index")).content.decode())
    for name in ("Memories", "Summaries", "API tokens", "LLM calls", "Teams and kins", "Sessions",
                 "Facts and experience"):
        assert name in index, name
    assert "Memorys" not in index and "Api tokens" not in index and "Kinsite core" not in index

    def page(name: str, **params) -> list[str]:
        return wording(staff_client.get(reverse(f"admin:{name}_changelist"), params).content.decode())

    memory_list = _text(staff_client.get(reverse("admin:memories_memory_changelist")).content.decode())
    assert "Select memory to change" in memory_list and "4 memories" in memory_list
    assert "Mark selected memories deleted (history stays)" in memory_list
    events = page("sessions_app_event")
    assert {"External ID", "API", "WhatsApp", "Tool call", "Introspection start"} <= set(events)
    calls = page("kinsite_llmcall")
    assert {"Latency (ms)", "OK"} <= set(calls)
    facts = page("consolidation_fact")
    assert {"Consolidated", "Source", "API"} <= set(facts)
    assert "API" in page("consolidation_consolidationrun")  # the trigger filter
    assert "API" in page("memories_memory")  # the source filter
    assert {"Async"} <= set(page("sessions_app_turn"))
    assert {"Duration (ms)"} <= set(page("sessions_app_introspectionrun"))
    assert {"Client ID"} <= set(page("workflows_node"))
    assert "By active" in page("kinsite_prompttemplate")
    assert {"Time zone"} <= set(page("kinsite_team"))
    token_list = staff_client.get(reverse("admin:kinsite_apitoken_changelist")).content.decode()
    assert "Select API token to change" in token_list


def test_placeholder_error_says_an_introspection_template(staff_client, team):
    response = staff_client.post(reverse("admin:kinsite_prompttemplate_add"), {
        "team": team.pk, "kind": "introspection", "name": "Mine", "body": "Read {no_such_thing}.",
        "is_active": "",
    })
    assert response.status_code == 200  # the form again, with the error
    page = html.unescape(response.content.decode())
    assert "an introspection template may use" in page
    assert "a introspection" not in page
