"""The experience page and the fact ledger through Django's test client: the document
(escaped), versions and diffs, consolidation runs with their audit details, "Consolidate
now", facts pending first with "Add fact", other teams' kins → 404."""
import json

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils.html import escape

from consolidation import services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from tests.factories import ConsolidationRunFactory, ExperienceVersionFactory, KinFactory
from tests.support.scripted_model import ScriptedProvider

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'
ESCAPED_XSS = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"

V1 = """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants answers in bullet points.
## 2. Defensive Safeguards & Heuristics
## 3. Project-Specific Constraints
- The churn report deduplicates by email.
## 4. Anti-Patterns & Critical Gotchas
## 5. Mistake Corrections & Fixes"""
V2 = V1.replace("by email.", "by customer id.")


def url(name, *args):
    return reverse(f"dashboard:{name}", args=args)


def version(kin, number, markdown, run=None) -> ExperienceVersion:
    return ExperienceVersionFactory(
        kin=kin, version=number, markdown=markdown, word_count=len(markdown.split()), run=run
    )


def document_of(body: str) -> str:
    """The rendered document of an experience page (Markdown output has no div)."""
    return body.split('<div class="markdown-body" id="experience-markdown">')[1].split("</div>")[0]


def fact(kin, statement, **fields) -> Fact:
    return services.fact_record(kin=kin, statement=statement, source=Fact.Source.API, **fields)


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


@pytest.fixture
def foreign_kin(other_team):
    return KinFactory(team=other_team)


def test_anonymous_users_are_sent_to_login(client, kin):
    for page in ("experience", "fact_list"):
        response = client.get(url(page, kin.pk))

        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_kin_page_links_to_experience_and_facts(logged_in, kin):
    body = logged_in.get(url("kin_detail", kin.pk)).content.decode()

    assert url("experience", kin.pk) in body
    assert url("fact_list", kin.pk) in body


def test_page_without_a_document_says_so(logged_in, kin):
    response = logged_in.get(url("experience", kin.pk))

    assert response.status_code == 200
    body = response.content.decode()
    assert "No experience document yet" in body
    assert "No consolidation has run yet." in body
    assert 'id="experience-diff"' not in body


def test_shows_the_current_document_and_every_version(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    response = logged_in.get(url("experience", kin.pk))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Current document" in body and "version 2" in body
    assert "deduplicates by customer id." in body
    assert "?version=1" in body and "?version=2" in body


def test_document_text_is_escaped(logged_in, kin):
    version(kin, 1, V1 + f"\n- Never run {XSS}")

    body = logged_in.get(url("experience", kin.pk)).content.decode()

    assert XSS not in body
    assert ESCAPED_XSS in body


def test_default_diff_compares_the_previous_version_with_the_current_one(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    response = logged_in.get(url("experience", kin.pk))

    body = response.content.decode()
    assert response.context["diff_from"] == 1 and response.context["diff_to"] == 2
    assert '<span class="diff-del">-- The churn report deduplicates by email.</span>' in body
    assert '<span class="diff-add">+- The churn report deduplicates by customer id.</span>' in body
    assert "Changes from version 1 to version 2" in body


def test_diff_between_any_two_chosen_versions(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)
    version(kin, 3, V2 + "\n- Check the date column first.")

    response = logged_in.get(url("experience", kin.pk), {"from": 1, "to": 3})

    kinds = {(line.kind, line.text) for line in response.context["diff"]}
    assert ("del", "-- The churn report deduplicates by email.") in kinds
    assert ("add", "+- Check the date column first.") in kinds
    assert ("file", "--- version 1") in kinds and ("file", "+++ version 3") in kinds


def test_diff_of_identical_versions_says_they_are_the_same(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V1)

    body = logged_in.get(url("experience", kin.pk), {"from": 1, "to": 2}).content.decode()

    assert "The two versions are the same." in body


def test_diff_text_is_escaped(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V1 + f"\n- {XSS}")

    body = logged_in.get(url("experience", kin.pk)).content.decode()

    assert XSS not in body
    assert f'<span class="diff-add">+- {ESCAPED_XSS}</span>' in body


def test_diff_with_an_unknown_version_asks_for_existing_ones(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    response = logged_in.get(url("experience", kin.pk), {"from": 1, "to": 9})

    assert response.status_code == 200
    assert "Choose two existing versions to compare." in response.content.decode()
    assert response.context["diff"] is None


def test_an_older_version_can_be_shown(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    response = logged_in.get(url("experience", kin.pk), {"version": 1})

    assert response.context["shown"].version == 1
    body = response.content.decode()
    assert "show the current version" in body
    assert "<li>The churn report deduplicates by email.</li>" in document_of(body)


def test_the_document_is_rendered_from_markdown_with_its_source_beside_it(logged_in, kin):
    version(kin, 1, V1 + "\n\nSee [the runbook](https://wiki.example.com/churn) and use *emphasis*.")

    body = logged_in.get(url("experience", kin.pk)).content.decode()

    document = document_of(body)
    assert "<h1>Master AI Experience</h1>" in document
    assert "<h2>1. User Directives &amp; Preferences</h2>" in document
    assert "<ul>\n<li>Maria wants answers in bullet points.</li>\n</ul>" in document
    assert ('<a href="https://wiki.example.com/churn" rel="nofollow noopener noreferrer">the runbook</a>'
            in document)
    assert "<em>emphasis</em>" in document
    source = body.split('id="experience-source">')[1].split("</pre>")[0]
    assert source.startswith("# Master AI Experience\n## 1. User Directives &amp; Preferences\n- Maria")


def test_a_hostile_document_renders_inert(logged_in, kin):
    hostile = (
        f"# Heading {XSS}\n- <img src=x onerror=alert(1)>\n- [click](javascript:alert(1))\n"
        '- ![pixel](https://tracker.example.com/p.gif)\n- <a href="https://e.com" onclick="alert(1)">a</a>\n'
        "- {{ request.user.password }}{% debug %}"
    )
    version(kin, 1, hostile)

    body = logged_in.get(url("experience", kin.pk)).content.decode()

    document = document_of(body)
    assert XSS not in body and "<img" not in body and 'href="javascript' not in body.lower()
    assert f"<h1>Heading {ESCAPED_XSS}</h1>" in document
    assert "<li>&lt;img src=x onerror=alert(1)&gt;</li>" in document
    assert "<li>[click](javascript:alert(1))</li>" in document
    assert ">Image: pixel</a>" in document and 'src="' not in document
    assert "&lt;a href=&quot;https://e.com&quot; onclick=&quot;alert(1)&quot;&gt;a&lt;/a&gt;" in document
    assert "<li>{{ request.user.password }}{% debug %}</li>" in document
    assert escape(hostile) in body  # the source, escaped


def side_by_side(logged_in, kin, **params):
    return logged_in.get(url("experience", kin.pk), {"layout": "side-by-side", **params})


def test_side_by_side_pairs_changed_lines_and_aligns_unchanged_ones(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)
    version(kin, 3, V2 + "\n- Check the date column first.")

    response = side_by_side(logged_in, kin, **{"from": 1, "to": 3})

    assert response.status_code == 200
    rows = [(row.before.kind, row.before.number, row.after.kind, row.after.number) for row in response.context["diff"]]
    # V1 has 8 lines; line 6 changed, a line 9 was added after the last one; 3 lines of context.
    assert rows == [
        ("empty", None, "empty", None),  # lines 1-2, unchanged, left out
        ("same", 3, "same", 3), ("same", 4, "same", 4), ("same", 5, "same", 5),
        ("del", 6, "add", 6),
        ("same", 7, "same", 7), ("same", 8, "same", 8),
        ("empty", None, "add", 9),
    ]
    assert response.context["diff"][0].gap
    changed = response.context["diff"][4]
    assert changed.before.pieces == (("- The churn report deduplicates by ", False), ("email.", True))
    assert changed.after.pieces == (("- The churn report deduplicates by ", False), ("customer id.", True))
    body = response.content.decode()
    assert '<table class="experience-side-by-side" id="experience-diff">' in body
    assert ">Version 1</th>" in body and ">Version 3</th>" in body
    assert ('<td class="diff-number">6</td>\n        <td class="diff-del">- The churn report deduplicates by '
            "<mark>email.</mark></td>") in body
    assert ('<td class="diff-number">9</td>\n        <td class="diff-add">- Check the date column first.</td>'
            in body)
    assert '<pre class="experience-diff"' not in body


def test_side_by_side_separates_distant_changes_with_a_gap(logged_in, kin):
    lines = [f"- line {number}" for number in range(1, 21)]
    version(kin, 1, "\n".join(lines))
    changed = list(lines)
    changed[1], changed[17] = "- line two", "- line eighteen"
    version(kin, 2, "\n".join(changed))

    rows = side_by_side(logged_in, kin).context["diff"]

    assert [row.gap for row in rows].count(True) == 1
    assert [(row.before.number, row.after.number) for row in rows if not row.gap] == [
        (n, n) for n in [1, 2, 3, 4, 5, 15, 16, 17, 18, 19, 20]
    ]
    assert rows[5].gap and rows[5].before.kind == rows[5].after.kind == "empty"


def test_side_by_side_ends_with_a_gap_when_unchanged_lines_follow(logged_in, kin):
    lines = [f"- line {number}" for number in range(1, 11)]
    version(kin, 1, "\n".join(lines))
    version(kin, 2, "\n".join(lines).replace("- line 2\n", "- line two\n"))

    response = side_by_side(logged_in, kin)

    rows = response.context["diff"]
    assert [row.before.number for row in rows] == [1, 2, 3, 4, 5, None]
    assert rows[-1].gap
    assert response.content.decode().count('<tr class="diff-gap">') == 1


def test_side_by_side_escapes_every_line(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V1.replace("bullet points.", f"bullet points {XSS}"))

    body = side_by_side(logged_in, kin).content.decode()

    assert XSS not in body
    assert f'<td class="diff-add">- Maria wants answers in bullet <mark>points {ESCAPED_XSS}</mark></td>' in body


def test_side_by_side_with_an_unknown_version_asks_for_existing_ones(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    for params in ({"from": 1, "to": 9}, {"from": 2}, {"to": 2}):
        response = side_by_side(logged_in, kin, **params)

        assert response.status_code == 200
        assert "Choose two existing versions to compare." in response.content.decode()
        assert response.context["diff"] is None


def test_side_by_side_of_identical_versions_says_they_are_the_same(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V1)

    body = side_by_side(logged_in, kin).content.decode()

    assert "The two versions are the same." in body


def test_unified_stays_the_default_and_an_unknown_layout_is_unified(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)

    for params in ({}, {"layout": "unified"}, {"layout": "<b>"}):
        response = logged_in.get(url("experience", kin.pk), params)

        assert response.context["side_by_side"] is False
        assert response.context["diff"][0].text == "--- version 1"
        assert '<a href="?from=1&amp;to=2" id="diff-layout-unified" aria-current="true">' in response.content.decode()


def test_the_layout_switch_keeps_the_compared_versions_and_the_shown_one(logged_in, kin):
    version(kin, 1, V1)
    version(kin, 2, V2)
    version(kin, 3, V2 + "\n- Check the date column first.")

    unified = logged_in.get(url("experience", kin.pk), {"version": 2, "from": 1, "to": 3}).content.decode()
    assert ('<a href="?version=2&amp;from=1&amp;to=3&amp;layout=side-by-side" id="diff-layout-side-by-side">'
            in unified)
    assert '<input type="hidden" name="layout"' not in unified

    paired = side_by_side(logged_in, kin, version=2, **{"from": 1, "to": 3}).content.decode()
    assert '<a href="?version=2&amp;from=1&amp;to=3" id="diff-layout-unified">' in paired
    assert 'id="diff-layout-side-by-side" aria-current="true">' in paired
    # Comparing two other versions from the side-by-side page keeps that layout.
    assert '<input type="hidden" name="layout" value="side-by-side">' in paired


def test_an_unknown_version_answers_404(logged_in, kin):
    version(kin, 1, V1)

    assert logged_in.get(url("experience", kin.pk), {"version": 5}).status_code == 404


def test_runs_show_status_summary_template_words_errors_and_folded_details(logged_in, kin):
    applied = ConsolidationRunFactory(
        kin=kin,
        trigger="nightly",
        status="applied",
        template_source="team",
        summary_of_changes="Dedupe is now by customer id.",
        word_count=42,
        rendered_prompt=f"PROMPT TEXT {XSS}",
        raw_answers=['{"summary_of_changes": "RAW ANSWER"}'],
        processed_fact_ids=[7, 8],
        superseded_fact_ids=[3],
    )
    version(kin, 1, V2, run=applied)
    applied.experience_version = ExperienceVersion.objects.get(kin=kin)
    applied.save()
    ConsolidationRunFactory(
        kin=kin,
        trigger="api",
        status="rejected",
        template_source="default",
        validation_errors=["missing section ## 4. Anti-Patterns & Critical Gotchas"],
        error="The answer failed validation twice.",
    )

    response = logged_in.get(url("experience", kin.pk))

    body = response.content.decode()
    runs = body.split('id="consolidation-runs"')[1]
    assert runs.index("Rejected") < runs.index("Applied")  # newest first
    assert "Dedupe is now by customer id." in runs
    assert "template: team" in runs and "template: default" in runs
    assert "42 words" in runs
    assert "wrote <a href=\"?version=1\">version 1</a>" in runs
    assert "Processed facts: 7, 8 · superseded: 3" in runs
    assert "missing section ## 4. Anti-Patterns &amp; Critical Gotchas" in runs
    assert "The answer failed validation twice." in runs
    assert "<summary>Rendered prompt</summary>" in runs and "PROMPT TEXT" in runs
    assert "<summary>Model answer 1</summary>" in runs and "RAW ANSWER" in runs
    assert XSS not in body


def test_consolidate_now_with_prepare_renders_the_prompt_and_changes_nothing(logged_in, kin):
    fact(kin, "Maria wants weekly reports.")

    with provider_override(ScriptedProvider([])):  # any model call would fail the test
        response = logged_in.post(url("experience_consolidate", kin.pk), {"prepare": "on"})

    run = ConsolidationRun.objects.get(kin=kin)
    assert run.status == ConsolidationRun.Status.PREPARED and run.trigger == ConsolidationRun.Trigger.DASHBOARD
    assert response.status_code == 302
    assert response["Location"] == url("experience", kin.pk) + f"?run={run.pk}#run-{run.pk}"
    page = logged_in.get(response["Location"]).content.decode()
    assert f"Consolidation {run.pk}: <strong>Prepared</strong>" in page
    assert "Maria wants weekly reports." in page  # inside the folded rendered prompt
    assert not ExperienceVersion.objects.filter(kin=kin).exists()
    assert services_pending(kin) == 1


def services_pending(kin) -> int:
    return Fact.objects.filter(kin=kin, status="active", is_consolidated=False).count()


def test_consolidate_now_needs_post(logged_in, kin):
    assert logged_in.get(url("experience_consolidate", kin.pk)).status_code == 405
    assert not ConsolidationRun.objects.exists()


def test_other_teams_kin_answers_404(logged_in, foreign_kin):
    version(foreign_kin, 1, V1)
    fact(foreign_kin, "Foreign secret fact.")

    assert logged_in.get(url("experience", foreign_kin.pk)).status_code == 404
    assert logged_in.get(url("fact_list", foreign_kin.pk)).status_code == 404
    assert logged_in.post(url("fact_list", foreign_kin.pk), {"statement": "x", "category": "fact"}).status_code == 404
    assert logged_in.post(url("experience_consolidate", foreign_kin.pk), {"prepare": "on"}).status_code == 404
    assert not ConsolidationRun.objects.exists()
    assert Fact.objects.count() == 1


def test_facts_list_pending_first_then_newest(logged_in, kin):
    old_pending = fact(kin, "Old pending fact.")
    consolidated = fact(kin, "Consolidated fact.")
    superseded = fact(kin, "Superseded fact.")
    new_pending = fact(kin, "New pending fact.")
    Fact.objects.filter(pk=consolidated.pk).update(is_consolidated=True)
    Fact.objects.filter(pk=superseded.pk).update(status=Fact.Status.SUPERSEDED)

    response = logged_in.get(url("fact_list", kin.pk))

    shown = [f.pk for f in response.context["page"].object_list]
    assert shown == [new_pending.pk, old_pending.pk, superseded.pk, consolidated.pk]
    body = response.content.decode()
    assert "2 pending" in body
    assert body.index("New pending fact.") < body.index("Consolidated fact.")


def test_add_fact_records_a_pending_fact_by_the_user(logged_in, kin, user):
    response = logged_in.post(
        url("fact_list", kin.pk), {"statement": "Deploys happen on Tuesdays.", "category": "decision"}
    )

    added = Fact.objects.get(kin=kin)
    assert response.status_code == 302
    assert response["Location"] == url("fact_list", kin.pk) + f"?added={added.pk}"
    assert added.statement == "Deploys happen on Tuesdays."
    assert added.category == Fact.Category.DECISION
    assert added.source == Fact.Source.DASHBOARD and added.source_ref == f"user:{user.get_username()}"
    assert added.status == Fact.Status.ACTIVE and not added.is_consolidated
    page = logged_in.get(response["Location"]).content.decode()
    assert f"Fact {added.pk} added" in page and "Deploys happen on Tuesdays." in page


def test_add_fact_with_a_blank_statement_shows_the_form_again(logged_in, kin):
    response = logged_in.post(url("fact_list", kin.pk), {"statement": "  ", "category": "fact"})

    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert not Fact.objects.exists()


def test_fact_text_is_escaped(logged_in, kin):
    fact(kin, f"Never paste {XSS}")

    body = logged_in.get(url("fact_list", kin.pk)).content.decode()

    assert XSS not in body and ESCAPED_XSS in body


def test_consolidate_now_shows_a_failed_run_and_its_error(logged_in, kin):
    fact(kin, "Maria wants weekly reports.")

    with provider_override(ScriptedProvider([LLMError("The endpoint is down.")])):
        response = logged_in.post(url("experience_consolidate", kin.pk), follow=True)

    run = ConsolidationRun.objects.get(kin=kin)
    assert run.status == ConsolidationRun.Status.FAILED
    body = response.content.decode()
    assert f"Consolidation {run.pk}: <strong>Failed</strong>" in body
    assert "The endpoint is down." in body


def test_consolidate_now_while_another_run_holds_the_kin_says_so(logged_in, kin):
    key = services.LOCK_KEY.format(kin_id=kin.pk)
    cache.add(key, "another-run", timeout=60)
    try:
        response = logged_in.post(url("experience_consolidate", kin.pk), follow=True)
    finally:
        cache.delete(key)

    assert "Another consolidation of" in response.content.decode()
    assert not ConsolidationRun.objects.exists()


def test_consolidate_now_records_the_dashboard_as_its_trigger(logged_in, kin):
    pending = fact(kin, "Maria wants weekly reports.")
    with provider_override(ScriptedProvider([answer_for(pending)])):
        logged_in.post(url("experience_consolidate", kin.pk))

    run = ConsolidationRun.objects.get(kin=kin)
    assert (run.status, run.trigger) == ("applied", "dashboard")


def answer_for(*facts) -> str:
    return json.dumps({"updated_experience_markdown": V1, "processed_pending_ids": [f.pk for f in facts],
                       "superseded_fact_ids": [], "summary_of_changes": "Added a preference."})


def test_consolidate_now_without_pending_facts_says_so_and_changes_nothing(logged_in, kin):
    version(kin, 1, V1)

    with provider_override(ScriptedProvider([])):  # any model call would fail the test
        response = logged_in.post(url("experience_consolidate", kin.pk), follow=True)

    assert f"Nothing to consolidate: {kin.name} has no pending facts." in response.content.decode()
    assert not ConsolidationRun.objects.exists()
    assert list(ExperienceVersion.objects.filter(kin=kin).values_list("version", flat=True)) == [1]
